"""Neuron device count and error counters, on the pre-2.31 sysfs layout and a relocated one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hpresilience.health.base import CheckContext, Status
from hpresilience.health.checks.neuron import (
    NeuronCount,
    NeuronCounters,
    NeuronCountersOptions,
    NeuronCountOptions,
    find_counters,
)
from hpresilience.health.runner import run_one
from hpresilience.reasons import Action

LAYOUTS = {
    "sysfs-neuron-pre231": {
        "ecc": "stats/hardware/mem_ecc_uncorrected",
        "hw_error": "neuron_core1/stats/status/hw_error/total",
        "reset": "neuron_core0/stats/other_info/reset_fail_count/total",
        "repairable": "stats/hardware/mem_ecc_repairable_uncorrected",
        "core": "neuron_core1/stats/status/{}/total",
    },
    "sysfs-neuron-relocated": {
        "ecc": "hardware/ecc/mem_ecc_uncorrected",
        "hw_error": "cores/neuron_core1/status/hw_error/total",
        "reset": "cores/neuron_core0/reset/reset_fail_count",
        "repairable": "hardware/ecc/mem_ecc_repairable_uncorrected",
        "core": "cores/neuron_core1/status/{}/total",
    },
}


def dev(ctx: CheckContext, n: int) -> Path:
    return ctx.paths.sys("devices", "virtual", "neuron_device", f"neuron{n}")


def bump(path: Path, by: int = 1) -> None:
    path.write_text(f"{int(path.read_text()) + by}\n")


def counters(ctx: CheckContext, since_boot: bool = True):  # type: ignore[no-untyped-def]
    return run_one(NeuronCounters(NeuronCountersOptions(since_boot=since_boot), ctx))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_counters_are_found_by_name_in_both_layouts(
    layout: str, tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext]
) -> None:
    tree(layout)
    ctx = ctx_factory()
    found = find_counters(dev(ctx, 0))
    names = sorted({Path(k).name if Path(k).name != "total" else Path(k).parent.name for k in found})
    assert names == [
        "hw_collectives_error",
        "hw_dma_abort_error",
        "hw_error",
        "hw_hbm_ue_error",
        "hw_nc_ue_error",
        "hw_repairable_hbm_ue_error",
        "mem_ecc_repairable_uncorrected",
        "mem_ecc_uncorrected",
        "reset_fail_count",
        "sram_ecc_uncorrected",
    ]
    assert len(found) == 17 and set(found.values()) == {0}  # 3 device counters + 7 per core x 2 cores
    r = counters(ctx)
    assert r.status == Status.OK and r.evidence["counters"] == 34


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(
    ("counter", "action"),
    [
        ("ecc", Action.REPLACE),
        ("repairable", Action.REBOOT),
        ("hw_error", Action.REBOOT),
        ("reset", Action.REBOOT),
    ],
)
def test_counter_increase_leads_to_its_action(
    layout: str,
    counter: str,
    action: Action,
    tree: Callable[..., Path],
    ctx_factory: Callable[..., CheckContext],
) -> None:
    tree(layout)
    ctx = ctx_factory()
    assert counters(ctx).status == Status.OK
    bump(dev(ctx, 1) / LAYOUTS[layout][counter], 2)
    r = counters(ctx)
    assert (r.status, r.action, r.certain) == (Status.FAIL, action, True)
    f = r.evidence["findings"][0]
    assert f["delta"] == 2 and f["counter"].startswith("neuron1/")


def test_baseline_is_kept_on_disk_and_a_fault_stays_reported_until_reboot(
    tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext]
) -> None:
    tree("sysfs-neuron-pre231")
    ctx = ctx_factory()
    bump(dev(ctx, 0) / LAYOUTS["sysfs-neuron-pre231"]["ecc"])
    assert counters(ctx).action == Action.REPLACE
    assert counters(ctx).action == Action.REPLACE  # not absorbed into the baseline
    assert (ctx.state_dir / "neuron-baseline.json").exists()
    # New boot: the driver starts its counters from zero again.
    (dev(ctx, 0) / LAYOUTS["sysfs-neuron-pre231"]["ecc"]).write_text("0\n")
    ctx.paths.proc("sys", "kernel", "random").mkdir(parents=True)
    ctx.paths.proc("sys", "kernel", "random", "boot_id").write_text("another-boot\n")
    assert counters(ctx).status == Status.OK


def test_since_boot_false_takes_the_first_look_as_baseline(
    tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext]
) -> None:
    tree("sysfs-neuron-relocated")
    ctx = ctx_factory()
    ecc = dev(ctx, 0) / LAYOUTS["sysfs-neuron-relocated"]["ecc"]
    bump(ecc, 5)
    assert counters(ctx, since_boot=False).status == Status.OK
    bump(ecc)
    r = counters(ctx, since_boot=False)
    assert r.status == Status.FAIL and r.evidence["findings"][0]["delta"] == 1


def test_cleared_counter_rebases_instead_of_going_negative(
    tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext]
) -> None:
    tree("sysfs-neuron-pre231")
    ctx = ctx_factory()
    hw = dev(ctx, 0) / LAYOUTS["sysfs-neuron-pre231"]["hw_error"]
    bump(hw, 3)
    assert counters(ctx, since_boot=False).status == Status.OK
    hw.write_text("0\n")  # an operator wrote to clear
    assert counters(ctx, since_boot=False).status == Status.OK
    bump(hw)
    assert counters(ctx, since_boot=False).status == Status.FAIL


def test_garbage_counter_value_is_skipped(tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext]) -> None:
    tree("sysfs-neuron-pre231")
    ctx = ctx_factory()
    (dev(ctx, 0) / LAYOUTS["sysfs-neuron-pre231"]["ecc"]).write_text("garbage\n")
    r = counters(ctx)
    assert r.status == Status.OK and r.evidence["counters"] == 33


def test_device_count_against_the_profile(tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext]) -> None:
    ctx = ctx_factory()
    assert run_one(NeuronCount(NeuronCountOptions(), ctx)).status == Status.NOT_APPLICABLE
    assert run_one(NeuronCount(NeuronCountOptions(required=True), ctx)).status == Status.FAIL
    tree("sysfs-neuron-pre231")
    assert run_one(NeuronCount(NeuronCountOptions(), ctx)).status == Status.OK
    r = run_one(NeuronCount(NeuronCountOptions(expected=16), ctx))
    assert (r.status, r.action, r.certain) == (Status.FAIL, Action.REBOOT, False)
    assert "2 Neuron device(s), profile expects 16" in r.reason


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(
    ("counter", "action"),
    [
        ("hw_hbm_ue_error", Action.REPLACE),
        ("hw_nc_ue_error", Action.REPLACE),
        ("hw_dma_abort_error", Action.REBOOT),
        ("hw_collectives_error", Action.REBOOT),
        ("hw_repairable_hbm_ue_error", Action.REBOOT),
    ],
)
def test_per_core_hardware_counter_increase_leads_to_its_action(
    layout: str,
    counter: str,
    action: Action,
    tree: Callable[..., Path],
    ctx_factory: Callable[..., CheckContext],
) -> None:
    """The driver's per-NeuronCore status counters, one per execution that hit that hardware error."""
    tree(layout)
    ctx = ctx_factory()
    assert counters(ctx).status == Status.OK
    bump(dev(ctx, 1) / LAYOUTS[layout]["core"].format(counter))
    r = counters(ctx)
    assert (r.status, r.action, r.key, r.certain) == (Status.FAIL, action, f"neuron.{counter}:neuron1", True)
    assert r.evidence["findings"][0]["core"] == "neuron_core1"


def test_per_core_counter_action_is_a_profile_setting(tmp_path: Path) -> None:
    from hpresilience.testing.fakenode import FakeNode
    from tests.health.conftest import run_node

    node = FakeNode.make(tmp_path / "trn1", "trn1.32xlarge", efa=1)
    node.inject("neuron_core_error:hw_collectives_error:3:1")
    r = run_node(node, ["neuron.counters"])[0]["neuron.counters"]
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT) and "neuron_core1" in r.reason
    opts = {"neuron.counters": {"actions": {"hw_collectives_error": "warn"}}}
    r = run_node(node, ["neuron.counters"], **opts)[0]["neuron.counters"]
    assert (r.status, r.action) == (Status.WARN, Action.NONE)


def test_unknown_counter_in_actions_is_a_config_error(tmp_path: Path) -> None:
    from hpresilience.errors import ConfigError
    from hpresilience.testing.fakenode import FakeNode
    from tests.health.conftest import run_node

    node = FakeNode.make(tmp_path / "trn1", "trn1.32xlarge", efa=1)
    with pytest.raises(ConfigError, match=r"checks\.neuron\.counters\.actions.*hw_typo_error"):
        run_node(node, ["neuron.counters"], **{"neuron.counters": {"actions": {"hw_typo_error": "warn"}}})
