"""InfiniBand ports and error-counter growth, on our /sys/class/infiniband tree (mlx5 IB, RoCE bond, one EFA)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hpresilience.errors import ConfigError
from hpresilience.health.base import CheckContext, Status
from hpresilience.health.checks.efa import EfaDevices, EfaDevicesOptions, efa_devices
from hpresilience.health.checks.infiniband import (
    IbCounters,
    IbCountersOptions,
    IbPorts,
    IbPortsOptions,
    ib_ports,
)
from hpresilience.health.runner import run_one
from hpresilience.reasons import Action


@pytest.fixture()
def ctx(tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext]) -> CheckContext:
    tree("sysfs-ib")
    return ctx_factory()


def port(ctx: CheckContext, dev: str) -> Path:
    return ctx.paths.sys("class", "infiniband", dev, "ports", "1")


def test_mlx5_is_never_efa_and_efa_is_never_infiniband(ctx: CheckContext) -> None:
    assert [d.name for d in efa_devices(ctx)] == ["rdmap16s0"]
    assert [n for n, _ in ib_ports(ctx)] == ["mlx5_0/1", "mlx5_1/1", "mlx5_bond_0/1"]
    r = run_one(EfaDevices(EfaDevicesOptions(), ctx))
    assert r.evidence["devices"] == ["rdmap16s0"]


def test_active_ndr_ports_pass_and_the_ethernet_bond_is_listed_not_judged(ctx: CheckContext) -> None:
    r = run_one(IbPorts(IbPortsOptions(expected=2, min_rate_gbps=400), ctx))
    assert r.status == Status.OK, r.reason
    assert r.evidence["not_judged"] == {"mlx5_bond_0/1": "Ethernet"}
    assert r.evidence["ports"]["mlx5_0/1"]["rate_gbps"] == 400.0


def test_port_down_reboots_unless_the_profile_says_warn(ctx: CheckContext) -> None:
    (port(ctx, "mlx5_1") / "state").write_text("1: DOWN\n")
    (port(ctx, "mlx5_1") / "phys_state").write_text("3: Disabled\n")
    r = run_one(IbPorts(IbPortsOptions(), ctx))
    assert (r.status, r.action, r.key, r.certain) == (
        Status.FAIL,
        Action.REBOOT,
        "ib.port_down:mlx5_1/1",
        False,
    )
    r = run_one(IbPorts(IbPortsOptions(down_action="warn"), ctx))
    assert (r.status, r.action) == (Status.WARN, Action.NONE)


def test_port_stuck_in_polling_is_down(ctx: CheckContext) -> None:
    (port(ctx, "mlx5_0") / "state").write_text("2: INIT\n")
    (port(ctx, "mlx5_0") / "phys_state").write_text("2: Polling\n")
    r = run_one(IbPorts(IbPortsOptions(), ctx))
    assert r.status == Status.FAIL and "mlx5_0/1 state '2: INIT'" in r.reason


def test_rate_below_the_profile_warns(ctx: CheckContext) -> None:
    (port(ctx, "mlx5_0") / "rate").write_text("200 Gb/sec (4X HDR)\n")
    r = run_one(IbPorts(IbPortsOptions(min_rate_gbps=400), ctx))
    assert (r.status, r.action) == (Status.WARN, Action.NONE) and "200 Gb/s" in r.reason
    assert run_one(IbPorts(IbPortsOptions(), ctx)).status == Status.OK  # no rate in the profile: not judged


def test_fewer_ports_than_the_profile_expects_fails(ctx: CheckContext) -> None:
    r = run_one(IbPorts(IbPortsOptions(expected=8), ctx))
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT) and "expects 8" in r.reason


def test_no_infiniband_is_not_applicable(ctx_factory: Callable[..., CheckContext]) -> None:
    ctx = ctx_factory()
    assert run_one(IbPorts(IbPortsOptions(), ctx)).status == Status.NOT_APPLICABLE
    assert run_one(IbCounters(IbCountersOptions(), ctx)).status == Status.NOT_APPLICABLE
    assert run_one(IbPorts(IbPortsOptions(required=True), ctx)).status == Status.FAIL


def test_counter_growth_between_runs_warns_a_standing_count_does_not(ctx: CheckContext) -> None:
    """mlx5_1 carries 17 link_downed from before: history, not a fault. Only growth counts."""
    first = run_one(IbCounters(IbCountersOptions(), ctx))
    assert first.status == Status.OK and "baseline" in first.reason
    assert run_one(IbCounters(IbCountersOptions(), ctx)).status == Status.OK
    (port(ctx, "mlx5_1") / "counters" / "link_downed").write_text("18\n")
    (port(ctx, "mlx5_0") / "counters" / "port_rcv_errors").write_text("9\n")  # +6, under the 10 allowed
    r = run_one(IbCounters(IbCountersOptions(), ctx))
    assert (r.status, r.action) == (Status.WARN, Action.NONE)
    assert r.evidence["over"] == ["mlx5_1/1/link_downed +1 (limit 0)"]
    assert r.evidence["deltas"] == {"mlx5_1/1/link_downed": 1, "mlx5_0/1/port_rcv_errors": 6}


@pytest.mark.parametrize("counter", ["link_downed", "symbol_error", "port_rcv_errors", "link_error_recovery"])
def test_each_error_counter_is_watched(ctx: CheckContext, counter: str) -> None:
    run_one(IbCounters(IbCountersOptions(), ctx))
    f = port(ctx, "mlx5_0") / "counters" / counter
    f.write_text(f"{int(f.read_text()) + 50}\n")
    r = run_one(IbCounters(IbCountersOptions(), ctx))
    assert r.status == Status.WARN and counter in r.reason


def test_counters_cleared_or_a_new_boot_take_a_new_baseline(ctx: CheckContext) -> None:
    run_one(IbCounters(IbCountersOptions(), ctx))
    (port(ctx, "mlx5_1") / "counters" / "link_downed").write_text("0\n")  # perfquery -R
    assert run_one(IbCounters(IbCountersOptions(), ctx)).status == Status.OK
    boot = ctx.paths.proc("sys", "kernel", "random", "boot_id")
    boot.parent.mkdir(parents=True, exist_ok=True)
    boot.write_text("another-boot\n")
    (port(ctx, "mlx5_1") / "counters" / "link_downed").write_text("40\n")
    assert "baseline" in run_one(IbCounters(IbCountersOptions(), ctx)).reason


def test_unknown_counter_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="port_xmit_wait"):
        IbCountersOptions(max_increase={"port_xmit_wait": 1})


def test_profile_with_a_bad_ib_option_names_file_and_key(tmp_path: Path) -> None:
    from hpresilience.health.profiles import load_profile
    from hpresilience.health.settings import HealthSettings

    (tmp_path / "ib.yaml").write_text("name: ib\nextends: generic\nchecks:\n  ib.ports: {min_rate: 400}\n")
    with pytest.raises(ConfigError, match=r"ib\.yaml: checks\.ib\.ports\.min_rate: unknown key"):
        load_profile(HealthSettings(profile="ib", profile_dirs=[str(tmp_path)]))
