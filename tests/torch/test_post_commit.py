"""Failures after a commit (issue 22, item 3): reported through flush() and the failure list, the
background worker lives on, and flush()/close() return within their timeout even with a peer gone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpresilience.torch import CheckpointConfig, TieredCheckpointer
from hpresilience.torch.jobs import JobQueue, Stage
from tests.torch._workers import run_ranks, state_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.mark.slow
def test_markers_failing_on_one_rank_after_a_direct_save_are_reported_and_the_next_save_commits(
    tmp_path: Path,
) -> None:
    res = run_ranks(tmp_path, "post_commit_failure", cfg={"timeout_s": 10.0})
    r0, r1 = res
    assert "error" not in r0 and "error" not in r1, res
    # Rank 1 could not write step 1's markers; the ranks agreed to skip that step's peer copy.
    assert r1["flush1"] is False and r1["stages"] == ["markers", "peer_copy"]
    assert r0["flush1"] is False and r0["stages"] == ["peer_copy"]
    assert max(r0["flush1_s"], r1["flush1_s"]) < 10
    # The worker lived on: step 2 committed and was copied on both ranks.
    assert (r0["flush2"], r1["flush2"]) == (True, True)
    assert (r0["last_committed"], r1["last_committed"]) == (2, 2)
    # Rank 1 left without a word: rank 0's save fails, and flush/close still return in time.
    assert r0["third_save_ok"] is False and r0["flush_dead_peer"] is False
    assert r0["dead_peer_s"] < 10


def test_failed_upload_is_reported_by_flush_counted_and_the_next_step_still_saves(
    tmp_path: Path, s3_endpoint: str
) -> None:
    cfg = CheckpointConfig(
        namespace="u",
        memory_dir=str(tmp_path),
        replicate=False,
        background_staging=False,
        s3_base="s3://no-such-bucket/x",
        s3_every=1,
        s3_endpoint_url=s3_endpoint,
    )
    ck = TieredCheckpointer(cfg)
    try:
        ck.save(state_for(1, 0), 1)
        t0 = time.monotonic()
        assert ck.flush(timeout=20) is False
        assert time.monotonic() - t0 < 20
        assert {f.stage for f in ck.failures} == {Stage.UPLOAD}
        assert ck.stats.post_commit_failures >= 1 and ck.stats.uploads == 0
        ck.save(state_for(2, 0), 2)  # the worker lives on
        assert ck.flush(timeout=20) is False  # its upload failed too, and flush says so again
        assert ck.last_committed == 2 and ck.stats.committed == 2
        assert [f.step for f in ck.failures if f.stage is Stage.UPLOAD][-1] == 2
    finally:
        assert ck.close(timeout=20) is True  # nothing new failed since the last flush


def test_job_queue_join_gives_up_at_its_deadline() -> None:
    q: JobQueue[int] = JobQueue()
    q.put(1)
    t0 = time.monotonic()
    assert q.join(0.2) is False and 0.15 < time.monotonic() - t0 < 2
    assert q.get() == 1
    q.done()
    assert q.join(0.0) is True
