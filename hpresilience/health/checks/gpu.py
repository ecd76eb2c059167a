"""NVIDIA GPU checks over one NVML snapshot per run (pynvml, nvidia-smi XML, or a recording)."""

from __future__ import annotations

from pydantic import Field

from hpresilience.health.base import Check, CheckOptions, CheckResult, Status, SuggestedAction, register
from hpresilience.health.checks.common import Finding, ladder, nvidia_pci_devices, worst
from hpresilience.health.nvml import CLOCK_REASONS, GpuInfo, GpuSnapshot, NvmlUnavailable, open_reader
from hpresilience.health.xid import normalize_pci

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


class GpuCheck(Check):
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
            if nvidia_pci_devices(self.ctx.paths) or self.ctx.expect.get("gpus"):
                raise NvmlUnavailable(snap)
            self.absent(f"no NVIDIA GPU (NVML: {snap})")
        if snap.count == 0 and not self.ctx.expect.get("gpus"):
            self.absent("NVML reports no GPUs")
        return snap

    def gpus(self) -> list[GpuInfo]:
        return [g for g in self.snapshot().gpus if not g.lost]

    def summarize(self, findings: list[Finding], ok_reason: str, **evidence: object) -> CheckResult:
        if not findings:
            return self.ok(ok_reason, evidence=evidence)
        w = worst(findings)
        ev = {"findings": [f.to_dict() for f in findings], **evidence}
        if w.action == SuggestedAction.NONE:
            return self.result(Status.WARN, w.what, key=w.key, evidence=ev)
        return self.fail(w.what, w.action, w.key, w.certain, evidence=ev)


class GpuCountOptions(CheckOptions):
    expected: int | None = Field(default=None, ge=0)


@register
class GpuCount(GpuCheck):
    """GPU count vs the profile, and GPUs whose NVML handle is lost (fallen off the bus)."""

    name = "gpu.count"
    Options = GpuCountOptions

    def run(self) -> CheckResult:
        assert isinstance(self.options, GpuCountOptions)
        pci = nvidia_pci_devices(self.ctx.paths)
        try:
            snap = self.snapshot()
        except NvmlUnavailable as err:
            return self.fail(
                f"{len(pci)} NVIDIA GPU(s) on PCI but NVML unusable: {err}",
                SuggestedAction.REBOOT,
                "gpu.nvml_unavailable",
                False,
                pci_devices=pci,
            )
        expected = self.options.expected if self.options.expected is not None else self.ctx.expect.get("gpus")
        findings = []
        for g in snap.gpus:
            if g.lost:
                # The same key as kernel-log XID 79, so both sightings climb one escalation ladder.
                key = f"nvidia:79:{normalize_pci(g.pci_bus_id) if g.pci_bus_id else g.index}"
                action, boots = ladder(self.ctx, key)
                findings.append(
                    Finding(
                        f"GPU {g.index} {g.pci_bus_id} lost by the driver: {g.error}",
                        action,
                        key,
                        True,
                        {"gpu": g.index, "boots_seen": boots},
                    )
                )
        healthy = sum(1 for g in snap.gpus if not g.lost)
        if expected is not None and healthy < expected:
            findings.append(
                Finding(
                    f"{healthy} usable GPU(s), profile expects {expected}",
                    SuggestedAction.REBOOT,
                    "gpu.count",
                    False,
                    {"found": healthy, "expected": expected},
                )
            )
        elif expected is not None and snap.count > expected:
            findings.append(
                Finding(
                    f"{snap.count} GPUs, more than the {expected} the profile expects (wrong profile?)",
                    SuggestedAction.NONE,
                    "gpu.count_high",
                    False,
                    {},
                )
            )
        if len(pci) > snap.count:
            findings.append(
                Finding(
                    f"{len(pci)} NVIDIA GPUs on PCI, NVML sees {snap.count}",
                    SuggestedAction.REBOOT,
                    "gpu.count_pci",
                    False,
                    {"pci_devices": pci},
                )
            )
        return self.summarize(
            findings,
            f"{snap.count} GPU(s) present" + (f", {expected} expected" if expected is not None else ""),
            count=snap.count,
            expected=expected,
            source=snap.source,
            driver=snap.driver_version,
        )


class GpuMemoryOptions(CheckOptions):
    max_volatile_uncorrected: int = Field(default=0, ge=0)
    # None: aggregate (lifetime) uncorrected ECC is not judged; row remapping handles those on A100/H100.
    max_aggregate_uncorrected: int | None = Field(default=None, ge=0)
    # NVIDIA's RMA criterion: 512 remapped rows exhausted.
    max_uncorrectable_remaps: int = Field(default=512, ge=0)
    # Pre-Ampere page retirement table: 64 entries; at 60 the GPU is effectively out of spare pages.
    max_retired_pages: int = Field(default=60, ge=0)


@register
class GpuMemory(GpuCheck):
    """ECC, row remapping and page retirement."""

    name = "gpu.memory"
    Options = GpuMemoryOptions

    def run(self) -> CheckResult:
        o = self.options
        assert isinstance(o, GpuMemoryOptions)
        findings: list[Finding] = []
        for g in self.gpus():
            at = f"GPU {g.index} {g.pci_bus_id}"
            dev = normalize_pci(g.pci_bus_id) if g.pci_bus_id else str(g.index)
            if g.remap_failure:
                findings.append(
                    Finding(
                        f"{at}: row remapping failed",
                        SuggestedAction.REPLACE,
                        f"gpu.remap_failure:{dev}",
                        True,
                        {"gpu": g.index},
                    )
                )
            if (
                g.remapped_rows_uncorrected is not None
                and g.remapped_rows_uncorrected >= o.max_uncorrectable_remaps
            ):
                findings.append(
                    Finding(
                        f"{at}: {g.remapped_rows_uncorrected} rows remapped for uncorrectable "
                        f"errors (limit {o.max_uncorrectable_remaps})",
                        SuggestedAction.REPLACE,
                        f"gpu.remaps_exhausted:{dev}",
                        True,
                        {"gpu": g.index, "value": g.remapped_rows_uncorrected},
                    )
                )
            if g.sram_threshold_exceeded:
                findings.append(
                    Finding(
                        f"{at}: SRAM uncorrectable error threshold exceeded",
                        SuggestedAction.REPLACE,
                        f"gpu.sram_threshold:{dev}",
                        True,
                        {"gpu": g.index},
                    )
                )
            if (
                g.ecc_aggregate_uncorrected is not None
                and o.max_aggregate_uncorrected is not None
                and g.ecc_aggregate_uncorrected > o.max_aggregate_uncorrected
            ):
                findings.append(
                    Finding(
                        f"{at}: {g.ecc_aggregate_uncorrected} lifetime uncorrected ECC errors (limit "
                        f"{o.max_aggregate_uncorrected})",
                        SuggestedAction.REPLACE,
                        f"gpu.ecc_aggregate:{dev}",
                        True,
                        {"gpu": g.index, "value": g.ecc_aggregate_uncorrected},
                    )
                )
            retired = (g.retired_pages_sbe or 0) + (g.retired_pages_dbe or 0)
            if retired >= o.max_retired_pages and g.retired_pages_sbe is not None:
                findings.append(
                    Finding(
                        f"{at}: {retired} retired pages (limit {o.max_retired_pages})",
                        SuggestedAction.REPLACE,
                        f"gpu.retired_pages:{dev}",
                        True,
                        {"gpu": g.index, "value": retired},
                    )
                )
            for flag, what, key in (
                (g.remap_pending, "row remapping pending", "gpu.remap_pending"),
                (g.retired_pages_pending, "page retirement pending", "gpu.retire_pending"),
            ):
                if flag:
                    action, boots = ladder(self.ctx, f"{key}:{dev}")
                    findings.append(
                        Finding(
                            f"{at}: {what} (needs a reboot)",
                            action,
                            f"{key}:{dev}",
                            True,
                            {"gpu": g.index, "boots_seen": boots},
                        )
                    )
            if (
                g.ecc_volatile_uncorrected is not None
                and g.ecc_volatile_uncorrected > o.max_volatile_uncorrected
            ):
                action, boots = ladder(self.ctx, f"gpu.ecc_volatile:{dev}")
                findings.append(
                    Finding(
                        f"{at}: {g.ecc_volatile_uncorrected} uncorrected ECC errors since driver load",
                        action,
                        f"gpu.ecc_volatile:{dev}",
                        True,
                        {"gpu": g.index, "value": g.ecc_volatile_uncorrected, "boots_seen": boots},
                    )
                )
        return self.summarize(findings, "no ECC, row-remap or page-retirement faults")


class GpuPcieOptions(CheckOptions):
    # Link generation drops at idle to save power, so by default only the width is judged.
    check_generation: bool = False


@register
class GpuPcie(GpuCheck):
    """PCIe link trained below its maximum width (or generation): a warning, the GPU still works."""

    name = "gpu.pcie"
    Options = GpuPcieOptions

    def run(self) -> CheckResult:
        assert isinstance(self.options, GpuPcieOptions)
        findings = []
        links = {}
        for g in self.gpus():
            links[g.index] = (
                f"gen{g.pcie_gen_current}/{g.pcie_gen_max} x{g.pcie_width_current}/{g.pcie_width_max}"
            )
            if (
                g.pcie_width_current is not None
                and g.pcie_width_max
                and g.pcie_width_current < g.pcie_width_max
            ):
                findings.append(
                    Finding(
                        f"GPU {g.index} {g.pci_bus_id}: PCIe link x{g.pcie_width_current}, max "
                        f"x{g.pcie_width_max}",
                        SuggestedAction.NONE,
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
                    Finding(
                        f"GPU {g.index} {g.pci_bus_id}: PCIe gen{g.pcie_gen_current}, max "
                        f"gen{g.pcie_gen_max}",
                        SuggestedAction.NONE,
                        f"gpu.pcie_gen:{g.pci_bus_id}",
                        False,
                        {"gpu": g.index},
                    )
                )
        return self.summarize(findings, "PCIe links at full width", links=links)


class GpuClocksOptions(CheckOptions):
    reasons: list[str] = Field(
        default_factory=lambda: ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    )


@register
class GpuClocks(GpuCheck):
    """Hardware clock slowdown (thermal, power brake) active right now: a warning to investigate."""

    name = "gpu.clocks"
    Options = GpuClocksOptions

    def run(self) -> CheckResult:
        assert isinstance(self.options, GpuClocksOptions)
        bad = [r for r in self.options.reasons if r not in CLOCK_REASONS]
        if bad:
            return self.result(
                Status.UNKNOWN, f"unknown clock event reason(s) {bad}; known: {sorted(CLOCK_REASONS)}"
            )
        findings = []
        for g in self.gpus():
            if g.clock_event_reasons is None:
                continue
            active = [r for r in self.options.reasons if g.clock_event_reasons & CLOCK_REASONS[r]]
            if active:
                findings.append(
                    Finding(
                        f"GPU {g.index} {g.pci_bus_id}: clocks slowed by {', '.join(active)}",
                        SuggestedAction.NONE,
                        f"gpu.clocks:{g.pci_bus_id}",
                        False,
                        {"gpu": g.index, "mask": hex(g.clock_event_reasons)},
                    )
                )
        return self.summarize(findings, "no hardware clock slowdown active")


@register
class GpuRecoveryAction(GpuCheck):
    """The driver's own verdict (NVML field 230): reset/reboot/drain required."""

    name = "gpu.recovery"

    def run(self) -> CheckResult:
        findings = []
        reported = 0
        for g in self.gpus():
            if g.recovery_action is None:
                continue
            reported += 1
            name = RECOVERY_ACTIONS.get(g.recovery_action, f"unknown({g.recovery_action})")
            if g.recovery_action == 0:
                continue
            key = f"gpu.recovery:{normalize_pci(g.pci_bus_id) if g.pci_bus_id else g.index}"
            if g.recovery_action == 5:
                findings.append(
                    Finding(
                        f"GPU {g.index}: driver asks to {name}",
                        SuggestedAction.NONE,
                        key,
                        False,
                        {"gpu": g.index, "recovery_action": name},
                    )
                )
                continue
            action, boots = ladder(self.ctx, key)
            findings.append(
                Finding(
                    f"GPU {g.index} {g.pci_bus_id}: driver asks for {name}",
                    action,
                    key,
                    True,
                    {"gpu": g.index, "recovery_action": name, "boots_seen": boots},
                )
            )
        ok = "driver reports no recovery action" if reported else "driver does not report a recovery action"
        return self.summarize(findings, ok, gpus_reporting=reported)
