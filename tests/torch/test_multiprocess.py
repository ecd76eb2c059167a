"""Tiered checkpoints across real ranks: gloo on 127.0.0.1, one memory-tier folder per simulated node."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.torch._workers import run_ranks

pytestmark = pytest.mark.slow


def _ok(results: list[dict[str, object]]) -> list[dict[str, object]]:
    for r in results:
        assert "error" not in r and "exitcode" not in r, r
    return results


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Path:
    """Steps 1..3 saved with async_save by 2 ranks on 2 'nodes'; keep=2; step 2 also went to S3."""
    base = tmp_path_factory.mktemp("saved")
    cfg = {"keep": 2, "s3_base": "s3://ckpt/runs", "s3_every": 2, "s3_endpoint_url": s3_endpoint}
    res = _ok(run_ranks(base, "save", steps=[1, 2, 3], cfg=cfg))
    assert [r["last_committed"] for r in res] == [3, 3]
    return base


@pytest.fixture()
def cluster(saved: Path, tmp_path: Path) -> Iterator[Path]:
    """A private copy of the saved memory tiers, so each test may damage its own."""
    dst = tmp_path / "c"
    shutil.copytree(saved, dst)
    yield dst


def _cfg(s3_endpoint: str) -> dict[str, object]:
    return {"keep": 2, "s3_base": "s3://ckpt/runs", "s3_endpoint_url": s3_endpoint}


def test_async_saved_state_round_trips_on_every_rank_from_own_memory(cluster: Path, s3_endpoint: str) -> None:
    res = _ok(run_ranks(cluster, "load", cfg=_cfg(s3_endpoint)))
    assert [(r["step"], r["source"], r["match"]) for r in res] == [(3, "own", True), (3, "own", True)]
    # keep=2: step 1 was pruned only after 2 and 3 committed; its shard file went to the spare slot.
    assert not (cluster / "node0/job1/step_0000000001").exists()
    assert (cluster / "node0/job1/.spare/rank_0.bin").exists()


def test_lost_memory_tier_of_one_node_restores_from_its_peer_copy(cluster: Path, s3_endpoint: str) -> None:
    shutil.rmtree(cluster / "node1")
    res = _ok(run_ranks(cluster, "load", cfg=_cfg(s3_endpoint)))
    assert [(r["step"], r["source"], r["match"]) for r in res] == [(3, "own", True), (3, "peer", True)]
    # The restore put rank 1's shard back into its own tier.
    assert (cluster / "node1/job1/step_0000000003/rank_1.bin").exists()


def test_both_memory_tiers_lost_restores_newest_s3_step(cluster: Path, s3_endpoint: str) -> None:
    shutil.rmtree(cluster / "node0")
    shutil.rmtree(cluster / "node1")
    res = _ok(run_ranks(cluster, "load", cfg=_cfg(s3_endpoint)))
    assert [(r["step"], r["source"], r["match"]) for r in res] == [(2, "s3", True), (2, "s3", True)]


def test_flipped_byte_in_a_shard_is_caught_and_the_peer_copy_used(cluster: Path, s3_endpoint: str) -> None:
    shard = cluster / "node1/job1/step_0000000003/rank_1.bin"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    res = _ok(run_ranks(cluster, "load", cfg=_cfg(s3_endpoint)))
    assert [(r["step"], r["source"], r["match"]) for r in res] == [(3, "own", True), (3, "peer", True)]


def test_damaged_own_shard_and_damaged_peer_copy_fall_back_to_the_previous_step(
    cluster: Path, s3_endpoint: str
) -> None:
    """Issue 22 item 4: the peer copy is verified like every tier; with both copies of rank 1's newest
    shard damaged (and that step not in S3), every rank loads the previous step, exactly."""
    for shard in (
        cluster / "node1/job1/step_0000000003/rank_1.bin",
        cluster / "node0/job1/peer/1/step_0000000003/rank_1.bin",
    ):
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 3] ^= 0x04
        shard.write_bytes(bytes(raw))
    res = _ok(run_ranks(cluster, "load", cfg=_cfg(s3_endpoint)))
    assert [(r["step"], r["source"], r["match"]) for r in res] == [(2, "own", True), (2, "own", True)]


def test_rank_killed_mid_save_leaves_previous_step_loadable_and_partial_one_ignored(tmp_path: Path) -> None:
    res = run_ranks(tmp_path, "save", steps=[1, 2], crash_step=2, cfg={"timeout_s": 4.0})
    assert res[0].get("crash_save", "").startswith("failed"), res  # rank 0 saw its peer die mid-save
    assert res[1] == {"exitcode": 9}
    step2 = tmp_path / "node1/job1/step_0000000002"
    assert (step2 / "rank_1.bin.tmp").exists() and not (step2 / "rank_1.bin").exists()
    assert not (tmp_path / "node0/job1/step_0000000002/COMMIT").exists()
    out = _ok(run_ranks(tmp_path, "load"))
    assert [(r["step"], r["match"]) for r in out] == [(1, True), (1, True)]


def test_background_staging_saves_and_restores_across_ranks(tmp_path: Path) -> None:
    """With every tensor copied in the background, DCP's collectives wait for the copy on each rank."""
    cfg = {"keep": 2, "background_staging": True, "inline_staging_below_mib": 0}
    res = _ok(run_ranks(tmp_path, "save", steps=[1, 2], cfg=cfg))
    assert [r["last_committed"] for r in res] == [2, 2]
    res = _ok(run_ranks(tmp_path, "load", cfg=cfg))
    assert [(r["step"], r["source"], r["match"]) for r in res] == [(2, "own", True), (2, "own", True)]
