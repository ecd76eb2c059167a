"""The memory tier's life (issue 22, item 6): removed by close() at a clean end, kept for a relaunch,
and sized against both the tier's free space and the job's cgroup memory limit before the first save."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hpresilience.errors import ConfigError
from hpresilience.torch import CheckpointConfig, TieredCheckpointer
from hpresilience.torch.cleanup import cgroup_headroom
from tests.torch._workers import state_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
GIB = 1 << 30


def _ck(tmp_path: Path, **kw: Any) -> TieredCheckpointer:
    return TieredCheckpointer(CheckpointConfig(namespace="n", memory_dir=str(tmp_path), replicate=False, **kw))


def test_close_at_a_clean_end_removes_the_jobs_memory_tier(tmp_path: Path) -> None:
    ck = _ck(tmp_path)
    ck.save(state_for(1, 0), 1)
    assert ck.tier.step_dir(1).is_dir()
    assert ck.close() is True
    assert not (tmp_path / "n").exists() and tmp_path.exists()


def test_close_keep_tier_and_an_exception_in_the_with_block_keep_it_for_the_relaunch(tmp_path: Path) -> None:
    ck = _ck(tmp_path)
    ck.save(state_for(1, 0), 1)
    ck.close(keep_tier=True)
    assert (tmp_path / "n" / "step_0000000001" / "COMMIT").is_file()
    with pytest.raises(RuntimeError), _ck(tmp_path) as ck2:
        ck2.save(state_for(2, 0), 2)
        raise RuntimeError("training crashed")
    assert (tmp_path / "n" / "step_0000000002" / "COMMIT").is_file()
    with _ck(tmp_path) as ck3:
        assert ck3.load(state_for(0, 0)) == 2
    assert not (tmp_path / "n").exists()


def _cgroup_v2(tmp_path: Path, limit: int, current: int, *, file: int = 0, shmem: int = 0) -> tuple[str, str]:
    """A cgroup v2 tree as a Slurm task sees it: the job level carries the limit, the task level none."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text("0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n")
    root = tmp_path / "cg"
    job = root / "system.slice/slurmstepd.scope/job_77"
    task = job / "step_0/user/task_0"
    task.mkdir(parents=True)
    (task / "memory.max").write_text("max\n")
    (task / "memory.current").write_text(f"{current}\n")
    (job / "memory.max").write_text(f"{limit}\n")
    (job / "memory.current").write_text(f"{current}\n")
    (job / "memory.stat").write_text(f"anon 1000\nfile {file}\nshmem {shmem}\n")
    return str(proc), str(root)


def test_cgroup_headroom_takes_the_tightest_limit_up_the_tree_and_counts_page_cache_as_free(
    tmp_path: Path,
) -> None:
    proc, root = _cgroup_v2(tmp_path, 10 * GIB, 4 * GIB, file=3 * GIB, shmem=1 * GIB)
    h = cgroup_headroom(proc, root)
    assert h is not None and h.cgroup.endswith("job_77")
    assert h.free == 10 * GIB - 4 * GIB + 2 * GIB


def test_cgroup_v1_memory_controller_is_read_too(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("12:cpu,cpuacct:/slurm/uid_0/job_5\n11:memory:/slurm/uid_0/job_5/step_0\n")
    d = tmp_path / "cg" / "memory" / "slurm/uid_0/job_5"
    (d / "step_0").mkdir(parents=True)
    (d / "memory.limit_in_bytes").write_text(str(8 * GIB))
    (d / "memory.usage_in_bytes").write_text(str(GIB))
    h = cgroup_headroom(str(proc), str(tmp_path / "cg"))
    assert h is not None and h.free == 7 * GIB


def test_first_save_too_big_for_the_jobs_memory_limit_is_one_clear_error_before_writing(tmp_path: Path) -> None:
    ck = _ck(tmp_path, keep=2)
    # 1 MiB of headroom: the 2-tensor state (~4 KB) fits, 3 x a 1 MiB tensor does not.
    ck.tier.cgroup_paths = _cgroup_v2(tmp_path / "c", 2 * GIB, 2 * GIB - (1 << 20))
    import torch

    with pytest.raises(ConfigError, match=r"job's memory limit leaves 0\.00 GiB.*--mem"):
        ck.save({"w": torch.zeros(1 << 18)}, 1)  # 1 MiB: (2 + 1) x 1 MiB + staging > 1 MiB
    assert not ck.tier.step_dir(1).exists()
    ck.close()
    ok = _ck(tmp_path / "ok", keep=2)
    ok.tier.cgroup_paths = _cgroup_v2(tmp_path / "d", 2 * GIB, 1 * GIB)
    ok.save({"w": torch.zeros(1 << 18)}, 1)
    assert ok.tier.is_committed(ok.tier.step_dir(1))
    ok.close()


def test_flush_and_close_return_within_their_timeout_while_a_save_is_in_flight(tmp_path: Path) -> None:
    """Issue 32: both waited on the save's future without a timeout (6 s for a 6 s save; gloo's timeout_s
    when a peer is gone). A preemption exit asks for 0.5 s and gets about that; the save stays in flight and
    close() says it did not finish."""
    ck = _ck(tmp_path)
    release = threading.Event()
    ck.fault_hook = lambda rank: release.wait(30)  # the shard is written; its rename waits
    fut = ck.async_save(state_for(1, 0), 1)
    try:
        t0 = time.monotonic()
        assert ck.flush(timeout=0.5) is False
        assert time.monotonic() - t0 < 3
        t0 = time.monotonic()
        assert ck.close(timeout=0.5) is False
        assert time.monotonic() - t0 < 3
    finally:
        release.set()
        fut.result(timeout=30)


def test_close_returns_within_its_timeout_while_a_background_copy_runs(tmp_path: Path) -> None:
    ck = _ck(tmp_path, background_staging=True)
    stager = ck._stager
    orig = stager._copy

    def slow(pairs: Any, view: Any) -> Any:
        time.sleep(6)
        return orig(pairs, view)

    stager._copy = slow  # type: ignore[method-assign]
    big = {"w": torch.zeros(1 << 20)}  # 4 MiB: above the inline threshold, copied in the background
    fut = ck.async_save(big, 1)
    try:
        t0 = time.monotonic()
        assert ck.close(timeout=0.5) is False
        assert time.monotonic() - t0 < 3
    finally:
        fut.result(timeout=30)
