"""GPU memory health: ECC, row remapping, page retirement, and Blackwell's memory-repair flags."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field

from hpresilience.health.base import CheckOptions, CheckResult, register
from hpresilience.health.checks.gpu import GpuCheck
from hpresilience.health.checks.rules import How, Rule, apply
from hpresilience.health.nvml import GpuInfo
from hpresilience.health.xid import normalize_pci


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


def _retired(g: GpuInfo) -> int:
    return (g.retired_pages_sbe or 0) + (g.retired_pages_dbe or 0)


MemoryRule = Rule[GpuInfo, GpuMemoryOptions]


def _flag(
    key: str, flag: Callable[[GpuInfo], bool | None], text: str, how: How | Callable[[GpuMemoryOptions], How]
) -> MemoryRule:
    """A fault NVML reports as a yes/no flag of the GPU."""
    return MemoryRule(key, lambda g, o: bool(flag(g)), how, lambda g, o: text)


# In this order (the first failure asking the most is the result's reason; the ladder counts what matched).
MEMORY_RULES: tuple[MemoryRule, ...] = (
    _flag("gpu.remap_failure", lambda g: g.remap_failure, "row remapping failed", How.REPLACE),
    MemoryRule(
        "gpu.remaps_exhausted",
        lambda g, o: (
            g.remapped_rows_uncorrected is not None and g.remapped_rows_uncorrected >= o.max_uncorrectable_remaps
        ),
        How.REPLACE,
        lambda g, o: (
            f"{g.remapped_rows_uncorrected} rows remapped for uncorrectable errors (limit {o.max_uncorrectable_remaps})"
        ),
        lambda g, o: {"value": g.remapped_rows_uncorrected},
    ),
    _flag(
        "gpu.sram_threshold",
        lambda g: g.sram_threshold_exceeded,
        "SRAM uncorrectable error threshold exceeded",
        How.REPLACE,
    ),
    MemoryRule(
        "gpu.ecc_aggregate",
        lambda g, o: (
            g.ecc_aggregate_uncorrected is not None
            and o.max_aggregate_uncorrected is not None
            and g.ecc_aggregate_uncorrected > o.max_aggregate_uncorrected
        ),
        How.REPLACE,
        lambda g, o: (
            f"{g.ecc_aggregate_uncorrected} lifetime uncorrected ECC errors (limit {o.max_aggregate_uncorrected})"
        ),
        lambda g, o: {"value": g.ecc_aggregate_uncorrected},
    ),
    MemoryRule(
        "gpu.retired_pages",
        lambda g, o: g.retired_pages_sbe is not None and _retired(g) >= o.max_retired_pages,
        How.REPLACE,
        lambda g, o: f"{_retired(g)} retired pages (limit {o.max_retired_pages})",
        lambda g, o: {"value": _retired(g)},
    ),
    _flag(
        "gpu.unrepairable_memory",
        lambda g: g.unrepairable_memory,
        "memory marked unrepairable",
        lambda o: How(o.unrepairable_memory_action),
    ),
    _flag(
        "gpu.channel_repair_pending",
        lambda g: g.channel_repair_pending,
        "memory channel repair pending (needs a reboot)",
        lambda o: How(o.repair_pending_action),
    ),
    _flag(
        "gpu.tpc_repair_pending",
        lambda g: g.tpc_repair_pending,
        "TPC repair pending (needs a reboot)",
        lambda o: How(o.repair_pending_action),
    ),
    _flag(
        "gpu.remap_pending",
        lambda g: g.remap_pending,
        "row remapping pending (needs a reboot)",
        How.REBOOT_THEN_REPLACE,
    ),
    _flag(
        "gpu.retire_pending",
        lambda g: g.retired_pages_pending,
        "page retirement pending (needs a reboot)",
        How.REBOOT_THEN_REPLACE,
    ),
    MemoryRule(
        "gpu.ecc_volatile",
        lambda g, o: g.ecc_volatile_uncorrected is not None and g.ecc_volatile_uncorrected > o.max_volatile_uncorrected,
        How.REBOOT_THEN_REPLACE,
        lambda g, o: f"{g.ecc_volatile_uncorrected} uncorrected ECC errors since driver load",
        lambda g, o: {"value": g.ecc_volatile_uncorrected},
    ),
)


@register
class GpuMemory(GpuCheck[GpuMemoryOptions]):
    """ECC, row remapping and page retirement: MEMORY_RULES over each GPU."""

    name = "gpu.memory"
    Options = GpuMemoryOptions

    def run(self) -> CheckResult:
        findings: list[CheckResult] = []
        for g in self.gpus():
            dev = normalize_pci(g.pci_bus_id) if g.pci_bus_id else str(g.index)
            findings += apply(
                self,
                MEMORY_RULES,
                g,
                self.options,
                where=f"GPU {g.index} {g.pci_bus_id}",
                device=dev,
                evidence={"gpu": g.index},
            )
        return self.summarize(findings, "no ECC, row-remap, page-retirement or memory-repair faults")
