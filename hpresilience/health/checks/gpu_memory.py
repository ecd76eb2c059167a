"""GPU memory health: ECC, row remapping, page retirement, and Blackwell's memory-repair flags."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpresilience.health.base import CheckOptions, CheckResult, register
from hpresilience.health.checks.common import ladder
from hpresilience.health.checks.gpu import GpuCheck
from hpresilience.health.xid import normalize_pci
from hpresilience.reasons import Action


class GpuMemoryOptions(CheckOptions):
    max_volatile_uncorrected: int = Field(default=0, ge=0)
    # None: aggregate (lifetime) uncorrected ECC is not judged; row remapping handles those on A100/H100.
    max_aggregate_uncorrected: int | None = Field(default=None, ge=0)
    # NVIDIA's RMA criterion: 512 remapped rows exhausted.
    max_uncorrectable_remaps: int = Field(default=512, ge=0)
    # Pre-Ampere page retirement table: 64 entries; at 60 the GPU is effectively out of spare pages.
    max_retired_pages: int = Field(default=60, ge=0)
    # Blackwell memory repair (schema v13): a channel or TPC repair is applied at the next GPU reset, so it
    # asks for a reboot (a replacement if it survives reboots); unrepairable memory is an RMA case.
    repair_pending_action: Literal["reboot_then_replace", "reboot", "warn"] = "reboot_then_replace"
    unrepairable_memory_action: Literal["replace", "reboot_then_replace", "warn"] = "replace"


@register
class GpuMemory(GpuCheck):
    """ECC, row remapping and page retirement."""

    name = "gpu.memory"
    Options = GpuMemoryOptions

    def run(self) -> CheckResult:
        o = self.options
        assert isinstance(o, GpuMemoryOptions)
        findings: list[CheckResult] = []
        for g in self.gpus():
            at = f"GPU {g.index} {g.pci_bus_id}"
            dev = normalize_pci(g.pci_bus_id) if g.pci_bus_id else str(g.index)
            if g.remap_failure:
                findings.append(
                    self.finding(
                        f"{at}: row remapping failed",
                        Action.REPLACE,
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
                    self.finding(
                        f"{at}: {g.remapped_rows_uncorrected} rows remapped for uncorrectable "
                        f"errors (limit {o.max_uncorrectable_remaps})",
                        Action.REPLACE,
                        f"gpu.remaps_exhausted:{dev}",
                        True,
                        {"gpu": g.index, "value": g.remapped_rows_uncorrected},
                    )
                )
            if g.sram_threshold_exceeded:
                findings.append(
                    self.finding(
                        f"{at}: SRAM uncorrectable error threshold exceeded",
                        Action.REPLACE,
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
                    self.finding(
                        f"{at}: {g.ecc_aggregate_uncorrected} lifetime uncorrected ECC errors (limit "
                        f"{o.max_aggregate_uncorrected})",
                        Action.REPLACE,
                        f"gpu.ecc_aggregate:{dev}",
                        True,
                        {"gpu": g.index, "value": g.ecc_aggregate_uncorrected},
                    )
                )
            retired = (g.retired_pages_sbe or 0) + (g.retired_pages_dbe or 0)
            if retired >= o.max_retired_pages and g.retired_pages_sbe is not None:
                findings.append(
                    self.finding(
                        f"{at}: {retired} retired pages (limit {o.max_retired_pages})",
                        Action.REPLACE,
                        f"gpu.retired_pages:{dev}",
                        True,
                        {"gpu": g.index, "value": retired},
                    )
                )
            if g.unrepairable_memory:
                findings.append(
                    self._flag_finding(
                        o.unrepairable_memory_action,
                        f"{at}: memory marked unrepairable",
                        f"gpu.unrepairable_memory:{dev}",
                        g.index,
                    )
                )
            for rflag, what, key in (
                (g.channel_repair_pending, "memory channel repair pending", "gpu.channel_repair_pending"),
                (g.tpc_repair_pending, "TPC repair pending", "gpu.tpc_repair_pending"),
            ):
                if rflag:
                    findings.append(
                        self._flag_finding(
                            o.repair_pending_action, f"{at}: {what} (needs a reboot)", f"{key}:{dev}", g.index
                        )
                    )
            for flag, what, key in (
                (g.remap_pending, "row remapping pending", "gpu.remap_pending"),
                (g.retired_pages_pending, "page retirement pending", "gpu.retire_pending"),
            ):
                if flag:
                    action, boots = ladder(self.ctx, f"{key}:{dev}")
                    findings.append(
                        self.finding(
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
                    self.finding(
                        f"{at}: {g.ecc_volatile_uncorrected} uncorrected ECC errors since driver load",
                        action,
                        f"gpu.ecc_volatile:{dev}",
                        True,
                        {"gpu": g.index, "value": g.ecc_volatile_uncorrected, "boots_seen": boots},
                    )
                )
        return self.summarize(findings, "no ECC, row-remap, page-retirement or memory-repair faults")

    def _flag_finding(self, how: str, what: str, key: str, index: int) -> CheckResult:
        if how == "warn":
            return self.finding(what, Action.NONE, key, False, {"gpu": index})
        if how == "replace":
            return self.finding(what, Action.REPLACE, key, True, {"gpu": index})
        if how == "reboot":
            return self.finding(what, Action.REBOOT, key, True, {"gpu": index})
        action, boots = ladder(self.ctx, key)
        return self.finding(what, action, key, True, {"gpu": index, "boots_seen": boots})
