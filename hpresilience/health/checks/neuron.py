"""AWS Neuron (Trainium/Inferentia): device count and hardware error counters from sysfs.

Neuron driver 2.31 moved sysfs nodes to new paths, not backwards compatibly. Counters are therefore
found by *name* under each `neuron<N>` directory (a bounded walk), whatever directories sit between:
`stats/hardware/mem_ecc_uncorrected` (pre-2.31) and any newer placement read the same. A counter is a
directory with `total` (status counters) or a plain file holding a number.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from hpresilience.health.base import (
    Check,
    CheckOptions,
    CheckResult,
    Status,
    read_int,
    register,
)
from hpresilience.health.checks.common import (
    finding_dict,
    load_json,
    neuron_devices,
    report,
    save_json,
)
from hpresilience.health.checks.rules import How, judge
from hpresilience.reasons import Action

# Counter name -> what an increase asks for (uncorrectable ECC: TERMINATE_INSTANCE in AWS's NPD config).
# Device level (`stats/hardware/*`, plain files) and per NeuronCore (`neuron_core<M>/stats/status/<name>/total`
# in the driver's status table, one counter per execution that ended in that hardware error; the per-core
# `hw_*` names mirror the kernel-log NEURON_HW_ERR codes: HBM_/NC_UNCORRECTABLE, DMA_ERROR,
# HANG_ON_COLLECTIVES).
COUNTERS: dict[str, How] = {
    "mem_ecc_uncorrected": How.REPLACE,
    "sram_ecc_uncorrected": How.REPLACE,
    "mem_ecc_repairable_uncorrected": How.REBOOT,
    "hw_error": How.REBOOT_THEN_REPLACE,
    "reset_fail_count": How.REBOOT_THEN_REPLACE,
    "hw_hbm_ue_error": How.REPLACE,
    "hw_nc_ue_error": How.REPLACE,
    "hw_dma_abort_error": How.REBOOT_THEN_REPLACE,
    "hw_collectives_error": How.REBOOT_THEN_REPLACE,
    # A repairable uncorrectable HBM error is repaired when the device resets: a reboot, not a replacement.
    "hw_repairable_hbm_ue_error": How.REBOOT,
}
CounterAction = Literal["warn", "reboot", "replace", "reboot_then_replace"]
SKIP_DIRS = {"power", "subsystem", "device", "driver", "memory_usage", "info"}
MAX_DEPTH = 6


def find_counters(device: Path) -> dict[str, int]:
    """Relative path -> value for every known counter under one device directory."""
    out: dict[str, int] = {}
    root_depth = str(device).count(os.sep)
    for dirpath, dirnames, filenames in os.walk(device, followlinks=False):
        if dirpath.count(os.sep) - root_depth >= MAX_DEPTH:
            dirnames[:] = []
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        here = Path(dirpath)
        for d in list(dirnames):
            if d in COUNTERS:
                v = read_int(here / d / "total")
                if v is not None:
                    out[str((here / d).relative_to(device))] = v
                dirnames.remove(d)
        for f in filenames:
            if f in COUNTERS:
                v = read_int(here / f)
                if v is not None:
                    out[str((here / f).relative_to(device))] = v
    return out


class NeuronCountOptions(CheckOptions):
    expected: int | None = Field(default=None, ge=0)


@register
class NeuronCount(Check[NeuronCountOptions]):
    name = "neuron.count"
    family = "neuron"
    Options = NeuronCountOptions

    def run(self) -> CheckResult:
        devs = neuron_devices(self.ctx.paths)
        expected = self.options.expected if self.options.expected is not None else self.ctx.expect.neuron_devices
        if not devs and not expected:
            return self.absent("no Neuron devices")
        ev = {"found": len(devs), "expected": expected, "devices": [d.name for d in devs]}
        if expected is not None and len(devs) < expected:
            return self.fail(
                f"{len(devs)} Neuron device(s), profile expects {expected}",
                Action.REBOOT,
                "neuron.count",
                False,
                evidence=ev,
            )
        if expected is not None and len(devs) > expected:
            return self.warn(
                f"{len(devs)} Neuron devices, more than the {expected} expected (wrong profile?)", evidence=ev
            )
        return self.ok(f"{len(devs)} Neuron device(s)", evidence=ev)


class NeuronCountersOptions(CheckOptions):
    # True: counters are since driver load, so the first look in a boot compares against zero.
    # False: the first look in a boot is the baseline (only increases after it count).
    since_boot: bool = True
    # Per-counter action over the built-in table, e.g. {hw_collectives_error: warn}.
    actions: dict[str, CounterAction] = Field(default_factory=dict)

    @field_validator("actions")
    @classmethod
    def _known_counters(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(v) - set(COUNTERS))
        if unknown:
            raise ValueError(f"unknown Neuron counter(s) {unknown}; known: {sorted(COUNTERS)}")
        return v


@register
class NeuronCounters(Check[NeuronCountersOptions]):
    """Uncorrected HBM/SRAM ECC, per-core hw_error, reset failures: deltas against a per-boot baseline."""

    name = "neuron.counters"
    family = "neuron"
    Options = NeuronCountersOptions

    def run(self) -> CheckResult:
        devs = neuron_devices(self.ctx.paths)
        if not devs:
            return self.absent("no Neuron devices")
        now = {f"{d.name}/{rel}": v for d in devs for rel, v in find_counters(d).items()}
        if not now:
            return self.result(
                Status.UNKNOWN,
                "Neuron devices present but no error counters found in sysfs "
                "(driver older than 2.14.5, or an unknown layout)",
                devices=[d.name for d in devs],
            )
        base = self._baseline(now)
        findings = [self._finding(k, v, base[k]) for k, v in sorted(now.items()) if v > base[k]]
        ev = {"counters": len(now), "devices": len(devs)}
        if not findings:
            return self.ok(f"{len(now)} error counters on {len(devs)} device(s) unchanged", evidence=ev)
        return report(findings, {**ev, "findings": [finding_dict(f) for f in findings]})

    def _baseline(self, now: dict[str, int]) -> dict[str, int]:
        """This boot's baseline per counter (kept on disk): zero, or the first look when not since_boot."""
        path = self.ctx.state_path("neuron-baseline.json")
        state = load_json(path)
        boot = self.ctx.boot_id()
        base: dict[str, int] = state.get("counters", {}) if state.get("boot_id") == boot else {}
        for k, v in now.items():
            if k not in base:
                base[k] = 0 if self.options.since_boot else v
            elif v < base[k]:  # written to clear (or the driver reloaded): start again from here
                base[k] = v
        save_json(path, {"boot_id": boot, "counters": base})
        return base

    def _finding(self, k: str, v: int, baseline: int) -> CheckResult:
        """A counter that rose: COUNTERS (over the options' `actions`) is this check's rule table."""
        counter = Path(k).name
        key = f"neuron.{counter}:{k.split('/')[0]}"
        how = How(self.options.actions.get(counter, COUNTERS[counter]))
        action, boots = judge(self.ctx, how, key)
        core = next((part for part in Path(k).parts if part.startswith("neuron_core")), "")
        detail = {
            "counter": k,
            "core": core,
            "value": v,
            "baseline": baseline,
            "delta": v - baseline,
            "boots_seen": boots or 0,
            "configured_action": how.value,
        }
        return self.finding(f"{k} rose by {v - baseline}", action, key, how is not How.WARN, detail)
