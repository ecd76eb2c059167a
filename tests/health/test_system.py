"""CPU and system checks: online CPUs, meminfo, disk, mounts, and a real (short) stress-ng run."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from hpresilience.health.base import CheckContext, Status
from hpresilience.health.checks.system import (
    Cpu,
    CpuOptions,
    Disk,
    DiskOptions,
    Memory,
    MemoryOptions,
    Mounts,
    MountsOptions,
    Stress,
    StressOptions,
    parse_cpu_list,
)
from hpresilience.health.runner import run_one
from hpresilience.reasons import Action


@pytest.mark.parametrize(("text", "n"), [("0-95\n", 96), ("0-3,8,10-11", 7), ("0", 1), ("", 0)])
def test_cpu_lists_are_counted(text: str, n: int) -> None:
    assert parse_cpu_list(text) == n


def test_offline_cpus_fail_against_the_profile(ctx_factory: Callable[..., CheckContext]) -> None:
    ctx = ctx_factory()
    (ctx.paths.sys("devices/system/cpu")).mkdir(parents=True)
    ctx.paths.sys("devices/system/cpu/online").write_text("0-93,95\n")
    assert run_one(Cpu(CpuOptions(), ctx)).status == Status.OK
    r = run_one(Cpu(CpuOptions(expected=96), ctx))
    assert (r.status, r.action, r.certain) == (
        Status.FAIL,
        Action.REBOOT,
        False,
    ) and "95 CPUs" in r.reason


def test_memory_total_and_available_from_procfs(ctx_factory: Callable[..., CheckContext]) -> None:
    ctx = ctx_factory()
    ctx.paths.proc("meminfo").write_text(
        "MemTotal:       2113433600 kB\nMemFree:        1000 kB\nMemAvailable:   52428800 kB\n"
    )
    r = run_one(Memory(MemoryOptions(min_total_gib=1940), ctx))
    assert r.status == Status.WARN and r.evidence["total_gib"] == pytest.approx(2015.5, abs=0.1)  # 2.5 % free
    r = run_one(Memory(MemoryOptions(min_total_gib=2040), ctx))
    assert r.status == Status.FAIL and "at least 2040" in r.reason


def test_disk_space_warns_when_low(tmp_path: Path, ctx_factory: Callable[..., CheckContext]) -> None:
    ctx = ctx_factory()
    assert run_one(Disk(DiskOptions(paths=[str(tmp_path)], min_free_gib=0), ctx)).status == Status.OK
    r = run_one(Disk(DiskOptions(paths=[str(tmp_path)], min_free_gib=10**9), ctx))
    assert r.status == Status.WARN and r.action == Action.NONE
    assert run_one(Disk(DiskOptions(paths=[str(tmp_path / "missing")]), ctx)).status == Status.WARN


def test_required_mounts(ctx_factory: Callable[..., CheckContext]) -> None:
    ctx = ctx_factory()
    ctx.paths.proc("mounts").write_text(
        "/dev/root / ext4 rw 0 0\nfs@tcp:/x /fsx lustre rw 0 0\n/dev/sdb /mnt/with\\040space ext4 rw 0 0\n"
    )
    assert run_one(Mounts(MountsOptions(mountpoints=["/fsx/", "/mnt/with space", "/"]), ctx)).status == Status.OK
    r = run_one(Mounts(MountsOptions(mountpoints=["/fsx", "/home"]), ctx))
    assert r.status == Status.FAIL and r.evidence["missing"] == ["/home"]


@pytest.mark.skipif(shutil.which("stress-ng") is None, reason="stress-ng not installed")
def test_stress_ng_runs_and_verifies(ctx_factory: Callable[..., CheckContext]) -> None:
    r = run_one(Stress(StressOptions(duration_s=1, cpu_workers=1, vm_workers=1, vm_bytes="16M"), ctx_factory()))
    assert r.status == Status.OK, r.evidence


def test_stress_ng_exit_codes_map_to_fail_and_unknown(
    ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str]
) -> None:
    failing = fake_tool("stress-ng", 'echo "stress-ng: fail: [42] cpu: verification failed" >&2; exit 2')
    r = run_one(Stress(StressOptions(duration_s=1), ctx_factory(commands={"stress_ng": failing})))
    assert (r.status, r.action, r.certain) == (Status.FAIL, Action.REBOOT, False)
    short = fake_tool("stress-ng2", "exit 3")
    assert (
        run_one(Stress(StressOptions(duration_s=1), ctx_factory(commands={"stress_ng": short}))).status
        == Status.UNKNOWN
    )
    assert (
        run_one(Stress(StressOptions(), ctx_factory(commands={"stress_ng": "/no/stress-ng"}))).status
        == Status.NOT_APPLICABLE
    )
