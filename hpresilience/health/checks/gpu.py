"""NVIDIA GPU checks over one NVML snapshot per run (pynvml, nvidia-smi XML, or a recording).

The memory check (ECC, remapping, repair flags) lives in gpu_memory.py.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from pydantic import Field

from hpresilience.health.base import (
    Check,
    CheckOptions,
    CheckResult,
    HostPaths,
    OptionsT,
    Status,
    read_text,
    register,
)
from hpresilience.health.checks.common import (
    finding_dict,
    ladder,
    load_json,
    nvidia_pci_devices,
    report,
    save_json,
)
from hpresilience.health.checks.rules import How, Rule, apply
from hpresilience.health.nvml import CLOCK_REASONS, GpuInfo, GpuSnapshot, NvmlUnavailable, open_reader
from hpresilience.health.xid import normalize_pci
from hpresilience.reasons import Action

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field 230) values.
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}


class GpuCheck(Check[OptionsT]):
    family = "gpu"

    def snapshot(self) -> GpuSnapshot:
        """The run's shared snapshot; absent GPUs raise NotApplicable (or fail when required)."""

        def read() -> GpuSnapshot | str:
            try:
                return open_reader(self.ctx.nvml, self.ctx.command("nvidia_smi")).snapshot()
            except NvmlUnavailable as err:
                return str(err)

        snap = self.ctx.cached("gpu.snapshot", read)
        if isinstance(snap, str):
            if nvidia_pci_devices(self.ctx.paths) or self.ctx.expect.gpus:
                raise NvmlUnavailable(snap)
            self.absent(f"no NVIDIA GPU (NVML: {snap})")
        if snap.count == 0 and not self.ctx.expect.gpus:
            self.absent("NVML reports no GPUs")
        return snap

    def gpus(self) -> list[GpuInfo]:
        return [g for g in self.snapshot().gpus if not g.lost]

    def summarize(self, findings: list[CheckResult], ok_reason: str, **evidence: object) -> CheckResult:
        if not findings:
            return self.ok(ok_reason, evidence=evidence)
        return report(findings, {"findings": [finding_dict(f) for f in findings], **evidence})


class GpuCountOptions(CheckOptions):
    expected: int | None = Field(default=None, ge=0)
    # Shortly after boot or a driver change NVML may see no GPUs (or fail to init) on a healthy node
    # (HyperPod agent PR #425): a missing GPU or an NVML failure then only warns until this has passed.
    grace_s: float = Field(default=300.0, ge=0, le=86400)


@register
class GpuCount(GpuCheck[GpuCountOptions]):
    """GPU count vs the profile, and GPUs whose NVML handle is lost (fallen off the bus)."""

    name = "gpu.count"
    Options = GpuCountOptions

    def _grace(self) -> str:
        """Why a missing GPU must not act yet ("" when it may): just booted, or the driver just changed."""
        if self.ctx.strict:
            return ""
        g = self.options.grace_s
        up = uptime_s(self.ctx.paths)
        if up is not None and up < g:
            return f"booted {up:.0f} s ago, grace {g:.0f} s"
        version = driver_version(self.ctx.paths)
        if version is None:
            return ""
        path = self.ctx.state_path("gpu-driver.json")
        state = load_json(path)
        now = time.time()
        if state.get("version") != version:
            # The first version ever seen is no change; a different one restarts the grace period.
            state = {"version": version, "since": now if state.get("version") else 0.0, "was": state.get("version")}
            save_json(path, state)
        since = float(state.get("since") or 0.0)
        if now - since < g:
            return f"driver changed from {state.get('was')} to {version} {now - since:.0f} s ago, grace {g:.0f} s"
        return ""

    def run(self) -> CheckResult:
        pci = nvidia_pci_devices(self.ctx.paths)
        grace = self._grace()
        try:
            snap = self.snapshot()
        except NvmlUnavailable as err:
            what = f"{len(pci)} NVIDIA GPU(s) on PCI but NVML unusable: {err}"
            if grace:
                return self.warn(f"{what} ({grace})", key="gpu.nvml_unavailable", pci_devices=pci)
            return self.fail(what, Action.REBOOT, "gpu.nvml_unavailable", False, pci_devices=pci)
        expected = self.options.expected if self.options.expected is not None else self.ctx.expect.gpus
        findings: list[CheckResult] = []
        for g in snap.gpus:
            # The same key as kernel-log XID 79, so both sightings climb one escalation ladder.
            dev = normalize_pci(g.pci_bus_id) if g.pci_bus_id else str(g.index)
            findings += apply(self, LOST_RULES, g, self.options, device=dev, evidence={"gpu": g.index})
        census = Census(snap.count, sum(1 for g in snap.gpus if not g.lost), pci, expected)
        findings += apply(self, COUNT_RULES, census, self.options, grace=grace)
        return self.summarize(
            findings,
            f"{snap.count} GPU(s) present" + (f", {expected} expected" if expected is not None else ""),
            count=snap.count,
            expected=expected,
            source=snap.source,
            driver=snap.driver_version,
        )


@dataclass(frozen=True)
class Census:
    """The node's GPUs as counted three ways: by NVML, usable by NVML, on the PCI bus; and the profile's count."""

    count: int
    healthy: int
    pci: list[str]
    expected: int | None

    @property
    def short(self) -> bool:
        return self.expected is not None and self.healthy < self.expected


LOST_RULES: tuple[Rule[GpuInfo, GpuCountOptions], ...] = (
    Rule(
        "nvidia:79",
        lambda g, o: g.lost,
        How.REBOOT_THEN_REPLACE,
        lambda g, o: f"GPU {g.index} {g.pci_bus_id} lost by the driver: {g.error}",
    ),
)
# A missing GPU right after boot or a driver change may be a slow start: those rules only warn in the grace.
COUNT_RULES: tuple[Rule[Census, GpuCountOptions], ...] = (
    Rule(
        "gpu.count",
        lambda c, o: c.short,
        How.REBOOT,
        lambda c, o: f"{c.healthy} usable GPU(s), profile expects {c.expected}",
        lambda c, o: {"found": c.healthy, "expected": c.expected},
        certain=False,
        held_in_grace=True,
    ),
    Rule(
        "gpu.count_high",
        lambda c, o: c.expected is not None and not c.short and c.count > c.expected,
        How.WARN,
        lambda c, o: f"{c.count} GPUs, more than the {c.expected} the profile expects (wrong profile?)",
    ),
    Rule(
        "gpu.count_pci",
        lambda c, o: len(c.pci) > c.count,
        How.REBOOT,
        lambda c, o: f"{len(c.pci)} NVIDIA GPUs on PCI, NVML sees {c.count}",
        lambda c, o: {"pci_devices": c.pci},
        certain=False,
        held_in_grace=True,
    ),
)


def driver_version(paths: HostPaths) -> str | None:
    """The loaded NVIDIA kernel module's version, without asking NVML (which may be what is broken)."""
    v = read_text(paths.sys("module", "nvidia", "version"))
    if v:
        return v
    text = read_text(paths.proc("driver", "nvidia", "version")) or ""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return m.group(1) if m else None


def uptime_s(paths: HostPaths) -> float | None:
    text = read_text(paths.proc("uptime"))
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


class GpuPcieOptions(CheckOptions):
    # Link generation drops at idle to save power, so by default only the width is judged.
    check_generation: bool = False
    # The width this instance type's GPUs train at when healthy. None: the GPU's own maximum. Some
    # virtualised instances (the A10G and T4 recordings of EC2 g5/g4dn) run healthy at x8 of x16.
    expected_width: int | None = Field(default=None, ge=1, le=32)


@register
class GpuPcie(GpuCheck[GpuPcieOptions]):
    """PCIe link trained below its maximum width (or generation): a warning, the GPU still works."""

    name = "gpu.pcie"
    Options = GpuPcieOptions

    def run(self) -> CheckResult:
        findings = []
        links = {}
        for g in self.gpus():
            links[g.index] = f"gen{g.pcie_gen_current}/{g.pcie_gen_max} x{g.pcie_width_current}/{g.pcie_width_max}"
            want = self.options.expected_width or g.pcie_width_max
            if g.pcie_width_current is not None and want and g.pcie_width_current < want:
                findings.append(
                    self.finding(
                        f"GPU {g.index} {g.pci_bus_id}: PCIe link x{g.pcie_width_current}, "
                        + (f"profile expects x{want}" if self.options.expected_width else f"max x{g.pcie_width_max}"),
                        Action.NONE,
                        f"gpu.pcie_width:{g.pci_bus_id}",
                        False,
                        {"gpu": g.index},
                    )
                )
            if (
                self.options.check_generation
                and g.pcie_gen_current is not None
                and g.pcie_gen_max
                and g.pcie_gen_current < g.pcie_gen_max
            ):
                findings.append(
                    self.finding(
                        f"GPU {g.index} {g.pci_bus_id}: PCIe gen{g.pcie_gen_current}, max gen{g.pcie_gen_max}",
                        Action.NONE,
                        f"gpu.pcie_gen:{g.pci_bus_id}",
                        False,
                        {"gpu": g.index},
                    )
                )
        full = f"at the expected x{self.options.expected_width}" if self.options.expected_width else "at full width"
        return self.summarize(findings, f"PCIe links {full}", links=links)


class GpuClocksOptions(CheckOptions):
    reasons: list[str] = Field(
        default_factory=lambda: ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    )


@register
class GpuClocks(GpuCheck[GpuClocksOptions]):
    """Hardware clock slowdown (thermal, power brake) active right now: a warning to investigate."""

    name = "gpu.clocks"
    Options = GpuClocksOptions

    def run(self) -> CheckResult:
        bad = [r for r in self.options.reasons if r not in CLOCK_REASONS]
        if bad:
            return self.result(Status.UNKNOWN, f"unknown clock event reason(s) {bad}; known: {sorted(CLOCK_REASONS)}")
        findings = []
        for g in self.gpus():
            if g.clock_event_reasons is None:
                continue
            active = [r for r in self.options.reasons if g.clock_event_reasons & CLOCK_REASONS[r]]
            if active:
                findings.append(
                    self.finding(
                        f"GPU {g.index} {g.pci_bus_id}: clocks slowed by {', '.join(active)}",
                        Action.NONE,
                        f"gpu.clocks:{g.pci_bus_id}",
                        False,
                        {"gpu": g.index, "mask": hex(g.clock_event_reasons)},
                    )
                )
        return self.summarize(findings, "no hardware clock slowdown active")


@register
class GpuRecoveryAction(GpuCheck[CheckOptions]):
    """The driver's own verdict (NVML field 230): reset/reboot/drain required."""

    name = "gpu.recovery"

    def run(self) -> CheckResult:
        findings = []
        reported = 0
        unrecognised = []
        for g in self.gpus():
            if g.recovery_action is None:
                continue
            reported += 1
            if g.recovery_action not in RECOVERY_ACTIONS:
                # A value this reader does not know is "unknown", never "nothing to do".
                text = g.recovery_action_text or str(g.recovery_action)
                unrecognised.append(f"GPU {g.index} {g.pci_bus_id}: recovery action {text!r}")
                continue
            name = RECOVERY_ACTIONS[g.recovery_action]
            if g.recovery_action == 0:
                continue
            key = f"gpu.recovery:{normalize_pci(g.pci_bus_id) if g.pci_bus_id else g.index}"
            if g.recovery_action == 5:
                findings.append(
                    self.finding(
                        f"GPU {g.index}: driver asks to {name}",
                        Action.NONE,
                        key,
                        False,
                        {"gpu": g.index, "recovery_action": name},
                    )
                )
                continue
            action, boots = ladder(self.ctx, key)
            findings.append(
                self.finding(
                    f"GPU {g.index} {g.pci_bus_id}: driver asks for {name}",
                    action,
                    key,
                    True,
                    {"gpu": g.index, "recovery_action": name, "boots_seen": boots},
                )
            )
        if unrecognised and not any(f.action != Action.NONE for f in findings):
            return self.result(
                Status.UNKNOWN,
                "unrecognised recovery action: " + "; ".join(unrecognised)[:250],
                unrecognised=unrecognised,
                findings=[finding_dict(f) for f in findings],
            )
        ok = "driver reports no recovery action" if reported else "driver does not report a recovery action"
        return self.summarize(findings, ok, gpus_reporting=reported)
