"""NVSwitch systems (HGX A100/H100: p4d, p5): the fabric manager must be running.

Without nvidia-fabricmanager the GPUs of an NVSwitch board cannot reach each other over NVLink: CUDA
jobs fail to start ("system not yet initialized"). Fatal SXid lines of the NVSwitches themselves are read
with the XIDs by the `xid` check (catalogue section `nvswitch`).
"""

from __future__ import annotations

from pydantic import Field

from hpresilience.health.base import Check, CheckOptions, CheckResult, Status, SuggestedAction, register
from hpresilience.health.checks.common import nvswitch_pci_devices
from hpresilience.health.proc import resolve, run_command

# `systemctl is-active` words: "active" is the only good one; "activating"/"reloading" are transient.
TRANSIENT = {"activating", "reloading", "deactivating"}


class FabricManagerOptions(CheckOptions):
    service: str = Field(default="nvidia-fabricmanager", min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9@_.\-]*$")


@register
class FabricManager(Check):
    """`systemctl is-active nvidia-fabricmanager` on nodes with NVSwitches."""

    name = "nvswitch.fabricmanager"
    family = "nvswitch"
    default_timeout_s = 10.0
    Options = FabricManagerOptions

    def run(self) -> CheckResult:
        assert isinstance(self.options, FabricManagerOptions)
        switches = nvswitch_pci_devices(self.ctx.paths)
        if not switches and not self.options.required:
            return self.absent("no NVSwitch on PCI")
        exe = resolve(self.ctx.command("systemctl"))
        if exe is None:
            return self.result(Status.UNKNOWN, "systemctl not found: fabric manager state unknown")
        res = run_command([exe, "is-active", "--", self.options.service], self.timeout_s - 1)
        if res.timed_out:
            return self.result(Status.UNKNOWN, res.describe())
        state = (res.stdout.strip().splitlines() or ["(no output)"])[0]
        ev = {"service": self.options.service, "state": state, "nvswitches": switches}
        if state == "active":
            return self.ok(f"{self.options.service} active ({len(switches)} NVSwitch(es))", evidence=ev)
        if state in TRANSIENT:
            return self.warn(f"{self.options.service} is {state}", key="nvswitch.fabricmanager", evidence=ev)
        # EKS node monitoring agent: FabricManagerNotRunning is fatal; the AWS suite resets. A restart of
        # the service is what a reboot does; not certain, so the agent confirms it on the next cycle.
        return self.fail(
            f"{self.options.service} is {state} on a node with {len(switches)} NVSwitch(es)",
            SuggestedAction.REBOOT,
            "nvswitch.fabricmanager",
            False,
            evidence=ev,
        )
