"""A node's CPU quota: the cpu hierarchy found in a mount table (v1, v2, hybrid), the files a quota writes in
each, and what they read back as; the join prefix that starts slurmd inside the node's cgroup."""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

import pytest

from hpresilience.errors import ConfigError
from hpresilience.testing import nodecpu
from hpresilience.testing.nodecpu import CpuHierarchy

# As /proc/self/mounts reads on the three kinds of host.
V1 = """sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V1_JOINED = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0\n"
V2 = "proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"


def test_the_cpu_hierarchy_is_v1_where_mounted_even_beside_a_unified_one_else_v2_else_none() -> None:
    assert nodecpu.find_hierarchy(V1) == CpuHierarchy(1, Path("/sys/fs/cgroup/cpu"))
    assert nodecpu.find_hierarchy(V1_JOINED) == CpuHierarchy(1, Path("/sys/fs/cgroup/cpu,cpuacct"))
    assert nodecpu.find_hierarchy(V2) == CpuHierarchy(2, Path("/sys/fs/cgroup"))
    assert (
        nodecpu.find_hierarchy("proc /proc proc rw 0 0\ncgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\n") is None
    )
    assert nodecpu.find_hierarchy("") is None and nodecpu.find_hierarchy("garbage\n\n") is None


def test_a_quota_writes_period_then_quota_on_v1_and_cpu_max_on_v2_and_one_cpu_removes_it() -> None:
    assert nodecpu.quota_files(1, 0.2) == [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "20000")]
    assert nodecpu.quota_files(2, 0.2) == [("cpu.max", "20000 100000")]
    assert nodecpu.quota_files(1, 1.0) == [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "-1")]
    assert nodecpu.quota_files(2, 1.0) == [("cpu.max", "max 100000")]
    assert nodecpu.quota_files(2, 0.01) == [("cpu.max", "1000 100000")]  # v1's floor: 1 ms per period


@pytest.mark.parametrize("bad", [0.0, -0.5, 0.005, math.nan])
def test_a_fraction_the_kernel_cannot_give_is_refused_in_one_line(bad: float) -> None:
    with pytest.raises(ConfigError, match=r"^--cpu must be a fraction of one CPU from 0.01 to 1 \(1 removes it\)"):
        nodecpu.quota_files(1, bad)


def test_the_quota_reads_back_as_the_fraction_written_and_none_when_unlimited() -> None:
    for version, fraction in ((1, 0.25), (2, 0.25), (1, 0.05), (2, 1.0), (1, 1.0)):
        files = dict(nodecpu.quota_files(version, fraction))
        got = nodecpu.read_fraction(version, files)
        assert got == (None if fraction >= 1 else fraction)
    assert nodecpu.read_fraction(2, {"cpu.max": "max 100000\n"}) is None
    assert nodecpu.read_fraction(1, {"cpu.cfs_quota_us": "50000\n", "cpu.cfs_period_us": "100000\n"}) == 0.5
    assert nodecpu.read_fraction(1, {"cpu.cfs_quota_us": "", "cpu.cfs_period_us": ""}) is None  # no cgroup
    assert nodecpu.read_fraction(2, {"cpu.max": "garbage"}) is None


def test_the_join_prefix_writes_the_commands_own_pid_then_becomes_it(tmp_path: Path) -> None:
    """Against a plain file standing in for cgroup.procs: the pid written is the pid the command then has."""
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    out = subprocess.run([*nodecpu.join_argv(procs), "sh", "-c", "echo $$"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert procs.read_text() == out.stdout.strip()


def test_cgroup_names_carry_the_base_port_so_clusters_on_other_ports_keep_theirs() -> None:
    assert nodecpu.cgroup_name(27100, "n2") == "hpr27100-n2"
    assert not nodecpu.cgroup_name(271000, "n2").startswith(nodecpu.cgroup_name(27100, ""))


def test_a_join_the_kernel_refuses_still_starts_the_command_and_says_why(tmp_path: Path) -> None:
    """A node must start even where its cgroup cannot be joined (a delegated v2 tree): unconfined, with a line."""
    missing = tmp_path / "no-such-cgroup" / "cgroup.procs"
    out = subprocess.run([*nodecpu.join_argv(missing), "echo", "started"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout == "started\n"
    assert out.stderr.startswith(f"nodecpu: not in {missing}")


def test_on_this_hosts_hierarchy_a_quota_reaches_the_joined_process_and_an_empty_cgroup_is_refused() -> None:
    """The real cpu controller (root only): prepare, join, quota, read back, and `down`'s removal."""
    if nodecpu.hierarchy() is None:
        pytest.skip("no writable cpu cgroup controller here")
    port = 1  # never a devcluster's: below every test block
    try:
        join = nodecpu.prepare(port, "x")
        assert join and join[-1].endswith(f"/{nodecpu.cgroup_name(port, 'x')}/cgroup.procs")
        with pytest.raises(ConfigError, match="has no process in its cpu cgroup"):
            nodecpu.set_quota(port, "x", 0.5)
        with subprocess.Popen([*join, "sleep", "30"]) as p:
            try:
                deadline = time.monotonic() + 10
                while str(p.pid) not in Path(join[-1]).read_text().split():
                    assert time.monotonic() < deadline, "the process never joined"
                    time.sleep(0.02)
                nodecpu.set_quota(port, "x", 0.5)
                assert nodecpu.quota(port, "x") == 0.5
                nodecpu.set_quota(port, "x", 1)
                assert nodecpu.quota(port, "x") is None
            finally:
                p.kill()
        assert nodecpu.remove_all(port) == [nodecpu.cgroup_name(port, "x")]
    finally:
        nodecpu.remove_all(port)
