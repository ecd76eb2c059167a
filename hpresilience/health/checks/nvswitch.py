"""NVSwitch systems (HGX A100/H100: p4d, p5): the fabric manager must be running, and what it logged.

Without nvidia-fabricmanager the GPUs of an NVSwitch board cannot reach each other over NVLink: CUDA
jobs fail to start ("system not yet initialized"). The fabric manager also logs the SXids it handles:
  [Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus
  id 00000000:86:00.0 physical id 3 port 33
Those of this boot are classified like the kernel's SXid lines (catalogue section `nvswitch`, same fault
key, so both sightings climb one ladder). The kernel's own SXid lines are read by the `xid` check.
"""

from __future__ import annotations

import re
import stat
import time
from pathlib import Path

from pydantic import Field

from hpresilience import proc
from hpresilience.health.base import (
    Check,
    CheckContext,
    CheckOptions,
    CheckResult,
    Status,
    register,
)
from hpresilience.health.checks.common import finding_dict, nvswitch_pci_devices, report, resolve_action
from hpresilience.health.xid import FaultEvent, load_catalog, normalize_pci
from hpresilience.proc import resolve
from hpresilience.reasons import Action

# `systemctl is-active` words: "active" is the only good one; "activating"/"reloading" are transient.
TRANSIENT = {"activating", "reloading", "deactivating"}


# Anchored on the fabric manager's own line layout: `[<time>] [ERROR] [tid N] detected NVSwitch ...`.
_FM_SXID = re.compile(
    r"^\[(?P<ts>[A-Z][a-z]{2} +\d{1,2} \d{4} \d\d:\d\d:\d\d)\] \[ERROR\] \[tid \d+\] detected NVSwitch "
    r"(?P<sev>fatal|non-fatal) error (?P<code>\d{1,6}) on fid \d+ on NVSwitch pci bus id (?P<pci>[0-9A-Fa-f:.]+)"
)
_FM_TEAM = re.compile(
    r"^\[(?P<ts>[A-Z][a-z]{2} +\d{1,2} \d{4} \d\d:\d\d:\d\d)\] \[ERROR\] \[tid \d+\] failed to find the GPU "
    r"handle \d+ in the multicast team"
)
MAX_LOG_BYTES = 8 * 1024 * 1024


class FabricManagerOptions(CheckOptions):
    service: str = Field(default="nvidia-fabricmanager", min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9@_.\-]*$")
    # The fabric manager's log (its config LOG_FILE_NAME); "" reads none.
    log_path: str = "/var/log/fabricmanager.log"


def _boot_time(ctx: CheckContext) -> float | None:
    try:
        for line in ctx.paths.proc("stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _fm_time(ts: str) -> float | None:
    """The fabric manager logs local time without a zone: read it as the node's local time."""
    try:
        return time.mktime(time.strptime(" ".join(ts.split()), "%b %d %Y %H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def read_fm_log(path: Path, since: float | None) -> tuple[list[FaultEvent], int]:
    """SXid events the fabric manager logged at or after `since` (None: all), and multicast-team failures."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            return [], 0
        size = st.st_size
        with open(path, "rb") as f:
            f.seek(max(0, size - MAX_LOG_BYTES))
            text = f.read(MAX_LOG_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return [], 0
    events, team_failures = [], 0
    for line in text.splitlines():
        if not line.startswith("["):
            continue
        m = _FM_SXID.match(line)
        t = _FM_TEAM.match(line) if m is None else None
        hit = m or t
        if hit is None:
            continue
        at = _fm_time(hit.group("ts"))
        if since is not None and (at is None or at < since):
            continue
        if t is not None:
            team_failures += 1
            continue
        assert m is not None
        sev = "fatal" if m.group("sev") == "fatal" else "nonfatal"
        events.append(
            FaultEvent(
                "nvswitch", str(int(m.group("code"))), normalize_pci(m.group("pci")), line[:300], at, str(path), sev
            )
        )
    return events, team_failures


@register
class FabricManager(Check[FabricManagerOptions]):
    """`systemctl is-active nvidia-fabricmanager` on nodes with NVSwitches."""

    name = "nvswitch.fabricmanager"
    family = "nvswitch"
    default_timeout_s = 10.0
    Options = FabricManagerOptions

    def run(self) -> CheckResult:
        switches = nvswitch_pci_devices(self.ctx.paths)
        if not switches and not self.options.required:
            return self.absent("no NVSwitch on PCI")
        exe = resolve(self.ctx.command("systemctl"))
        if exe is None:
            return self.result(Status.UNKNOWN, "systemctl not found: fabric manager state unknown")
        res = proc.run([exe, "is-active", "--", self.options.service], self.timeout_s - 1)
        if res.timed_out:
            return self.result(Status.UNKNOWN, res.describe())
        state = (res.stdout.strip().splitlines() or ["(no output)"])[0]
        findings = self._log_findings()
        ev = {
            "service": self.options.service,
            "state": state,
            "nvswitches": switches,
            "log": self.options.log_path,
            "findings": [finding_dict(f) for f in findings],
        }
        if state in TRANSIENT:
            findings.append(
                self.finding(f"{self.options.service} is {state}", Action.NONE, "nvswitch.fabricmanager", False, {})
            )
        elif state != "active":
            # EKS node monitoring agent: FabricManagerNotRunning is fatal; the AWS suite resets. A restart
            # of the service is what a reboot does; not certain, so the agent confirms it on the next cycle.
            findings.append(
                self.finding(
                    f"{self.options.service} is {state} on a node with {len(switches)} NVSwitch(es)",
                    Action.REBOOT,
                    "nvswitch.fabricmanager",
                    False,
                    {},
                )
            )
        if not findings:
            return self.ok(f"{self.options.service} active ({len(switches)} NVSwitch(es))", evidence=ev)
        return report(findings, ev)

    def _log_findings(self) -> list[CheckResult]:
        """This boot's SXids and multicast-team failures from the fabric manager's log."""
        if not self.options.log_path:
            return []
        events, team_failures = read_fm_log(Path(self.options.log_path), _boot_time(self.ctx))
        catalog = load_catalog(self.ctx.xid_overrides)
        out: dict[str, CheckResult] = {}
        for e in events:
            if e.key in out:
                continue
            c = catalog.classify(e)
            what = f"fabric manager: SXid {e.code} {e.severity} ({c.entry.name}) on {e.device}"
            if c.action in ("none", "warn"):
                out[e.key] = self.finding(what, Action.NONE, e.key, False, {"catalog_action": c.action})
                continue
            action, boots = resolve_action(self.ctx, c.action, e.key)
            out[e.key] = self.finding(what, action, e.key, True, {"catalog_action": c.action, "boots_seen": boots})
        if team_failures:
            out["nvswitch.multicast"] = self.finding(
                f"fabric manager: {team_failures} multicast team setup failure(s) (NVLink)",
                Action.NONE,
                "nvswitch.multicast",
                False,
                {"count": team_failures},
            )
        return list(out.values())
