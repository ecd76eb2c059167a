"""EFA checks: devices, ports, uverbs nodes, fi_info, and counter rates."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from hpresilience.health.base import CheckContext, CheckOptions, Status
from hpresilience.health.checks.efa import (
    EfaCounters,
    EfaCountersOptions,
    EfaDevices,
    EfaDevicesOptions,
    EfaFiInfo,
    EfaLoopback,
    EfaLoopbackOptions,
)
from hpresilience.health.runner import run_one
from hpresilience.reasons import Action

PORT = "class/infiniband/rdmap16s0/ports/1"


def efa_ctx(tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext], **kw: object) -> CheckContext:
    tree("sysfs-efa")
    tree("dev-efa", "dev")
    return ctx_factory(**kw)


def test_no_efa_is_not_applicable(ctx_factory: Callable[..., CheckContext]) -> None:
    ctx = ctx_factory()
    for check in (
        EfaDevices(EfaDevicesOptions(), ctx),
        EfaFiInfo(CheckOptions(), ctx),
        EfaCounters(EfaCountersOptions(), ctx),
    ):
        assert run_one(check).status == Status.NOT_APPLICABLE


def test_devices_ports_and_uverbs_from_a_recorded_tree(
    tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext]
) -> None:
    ctx = efa_ctx(tree, ctx_factory)
    r = run_one(EfaDevices(EfaDevicesOptions(expected=2), ctx))
    assert r.status == Status.OK and r.evidence["devices"] == ["rdmap16s0", "rdmap32s0"] and r.evidence["uverbs"] == 2
    r = run_one(EfaDevices(EfaDevicesOptions(expected=4), ctx))
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT) and "expects 4" in r.reason
    ctx.paths.sys(PORT, "state").write_text("1: DOWN\n")
    r = run_one(EfaDevices(EfaDevicesOptions(expected=2), ctx))
    assert r.status == Status.FAIL and "rdmap16s0 port 1 state '1: DOWN'" in r.reason
    ctx.paths.sys(PORT, "state").write_text("4: ACTIVE\n")
    ctx.paths.device("infiniband", "uverbs1").unlink()
    assert "uverbs" in run_one(EfaDevices(EfaDevicesOptions(), ctx)).reason


def test_counter_rates_use_deltas_against_the_previous_sample(
    tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext]
) -> None:
    ctx = efa_ctx(tree, ctx_factory)
    opts = EfaCountersOptions(rates={"retrans_timeout_events": 1.0, "rdma_read_wr_err": 1.0})
    assert "baseline" in run_one(EfaCounters(opts, ctx)).reason
    # Pretend the previous sample was 10 s ago, so rates are deterministic.
    state = ctx.state_dir / "efa-counters.json"
    data = json.loads(state.read_text())
    data["time"] -= 10
    state.write_text(json.dumps(data))
    ctx.paths.sys(PORT, "hw_counters", "retrans_timeout_events").write_text("5\n")  # 0.5/s: fine
    ctx.paths.sys(PORT, "hw_counters", "tx_bytes").write_text("99999999999\n")  # bytes are not judged
    r = run_one(EfaCounters(opts, ctx))
    assert r.status == Status.OK and r.evidence["deltas"] == {"rdmap16s0/port1/retrans_timeout_events": 5}
    data = json.loads(state.read_text())
    data["time"] -= 10
    state.write_text(json.dumps(data))
    ctx.paths.sys(PORT, "hw_counters", "rdma_read_wr_err").write_text("50\n")  # 5/s > 1/s
    r = run_one(EfaCounters(opts, ctx))
    assert (r.status, r.action) == (Status.WARN, Action.NONE)
    assert "rdmap16s0/port1/rdma_read_wr_err +50" in r.reason


def test_counter_reset_is_not_a_negative_rate(
    tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext]
) -> None:
    ctx = efa_ctx(tree, ctx_factory)
    run_one(EfaCounters(EfaCountersOptions(), ctx))
    ctx.paths.sys(PORT, "hw_counters", "retrans_pkts").write_text("0\n")
    assert run_one(EfaCounters(EfaCountersOptions(), ctx)).status == Status.OK


def test_fi_info_provider_present_missing_and_broken(
    tree: Callable[..., Path], ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str]
) -> None:
    good = fake_tool("fi_info", 'echo "provider: efa"; echo "    fabric: efa"; echo "provider: efa"')
    bad = fake_tool("fi_info_bad", 'echo "fi_getinfo: -61 (No data available)" >&2; exit 1')
    ctx = efa_ctx(tree, ctx_factory, commands={"fi_info": good})
    r = run_one(EfaFiInfo(CheckOptions(), ctx))
    assert r.status == Status.OK and r.evidence["endpoints"] == 2
    ctx = efa_ctx(tree, ctx_factory, commands={"fi_info": bad})
    r = run_one(EfaFiInfo(CheckOptions(), ctx))
    assert r.status == Status.FAIL and "No data available" in r.reason and not r.certain
    ctx = efa_ctx(tree, ctx_factory, commands={"fi_info": "/nonexistent/fi_info"})
    assert run_one(EfaFiInfo(CheckOptions(), ctx)).status == Status.NOT_APPLICABLE


def test_loopback_runs_server_and_client_per_device(
    tree: Callable[..., Path],
    ctx_factory: Callable[..., CheckContext],
    fake_tool: Callable[[str, str], str],
    tmp_path: Path,
) -> None:
    log = tmp_path / "pp.log"
    tool = fake_tool("fi_pingpong", f'echo "$@" >> {log}\ncase "$*" in *localhost*) exit 0;; *) sleep 30;; esac')
    ctx = efa_ctx(tree, ctx_factory, commands={"fi_pingpong": tool})
    r = run_one(EfaLoopback(EfaLoopbackOptions(iterations=10), ctx))
    assert r.status == Status.OK
    calls = log.read_text().splitlines()
    assert "-p efa -d rdmap16s0 -I 10 localhost" in calls and "-p efa -d rdmap32s0 -I 10" in calls
