"""Stale and backward restores (hpresilience/torch/staleness.py): a save that repeats the previous save's tensors
is flagged and refused by the load, which falls back; a restore behind a committed step is said, or refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.torch import CheckpointConfig, TieredCheckpointer
from hpresilience.torch.jobs import Stage
from hpresilience.torch.layout import ItemLoc, ShardIndex
from hpresilience.torch.loading import RestoreRefused
from hpresilience.torch.staleness import behind, is_stale
from tests.torch._workers import empty_state, matches, run_ranks, state_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def index(step: int, **checksums: int) -> ShardIndex:
    idx = ShardIndex(rank=0, step=step, size=0)
    for name, c in checksums.items():
        idx.items[(name, None)] = ItemLoc(0, 0, 4, c, "crc32c", "torch.float32" if name != "meta" else None, (1,))
    return idx


def test_equal_tensors_at_a_later_step_are_stale_whatever_the_pickled_items_say() -> None:
    assert is_stale(index(10, w=1, b=2, meta=5), index(20, w=1, b=2, meta=6))


def test_a_changed_tensor_an_added_one_or_an_earlier_step_is_not_stale() -> None:
    assert not is_stale(index(10, w=1, b=2), index(20, w=1, b=3))
    assert not is_stale(index(10, w=1), index(20, w=1, b=2))
    assert not is_stale(index(20, w=1), index(20, w=1))
    assert not is_stale(index(10, meta=1), index(20, meta=1))  # no tensor at all: nothing to compare


def test_behind_names_the_newest_committed_step_past_the_one_restored() -> None:
    assert behind(10, {10, 20}) == 20
    assert behind(20, {10, 20}) is None and behind(5, set()) is None


def ckpt(tmp_path: Path, **kw: object) -> TieredCheckpointer:
    return TieredCheckpointer(CheckpointConfig(namespace="job", memory_dir=str(tmp_path), keep=3, **kw))  # type: ignore[arg-type]


def stale_state(step: int) -> dict[str, object]:
    """What an asynchronous save that copied the weights of the step before would write for `step`."""
    s = state_for(step - 1, 0)
    s["meta"] = {"step": step, "note": f"s{step}"}
    return s


def test_a_stale_save_is_flagged_and_the_load_refuses_it_and_falls_back(tmp_path: Path) -> None:
    with ckpt(tmp_path) as ck:
        ck.save(state_for(1, 0), 1)
        ck.save(stale_state(2), 2)
        ck.flush()
        assert [(f.step, f.stage) for f in ck.failures] == [(2, Stage.STALE)]
        got = empty_state(0)
        assert ck.load(got) == 1 and matches(got, 1, 0)
        assert any("step 2: stale save" in s for s in ck.last_skipped)
        assert ck.last_behind is None  # a refused stale step is no high-water mark


def test_a_healthy_run_never_flags_a_save(tmp_path: Path) -> None:
    with ckpt(tmp_path) as ck:
        for step in (1, 2, 3):
            ck.save(state_for(step, 0), step)
        ck.flush()
        assert ck.failures == []
        got = empty_state(0)
        assert ck.load(got) == 3 and matches(got, 3, 0) and ck.last_behind is None


def _damage(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    path.write_bytes(bytes(raw))


def test_a_restore_behind_a_committed_step_is_reported(tmp_path: Path) -> None:
    with ckpt(tmp_path) as ck:
        ck.save(state_for(1, 0), 1)
        ck.save(state_for(2, 0), 2)
        ck.flush()
        _damage(ck.tier.step_dir(2) / "rank_0.bin")
        got = empty_state(0)
        assert ck.load(got) == 1 and matches(got, 1, 0)
        assert ck.last_behind == 2


def test_a_restore_behind_a_committed_step_is_refused_when_configured(tmp_path: Path) -> None:
    with ckpt(tmp_path, refuse_restore_behind=True) as ck:
        ck.save(state_for(1, 0), 1)
        ck.save(state_for(2, 0), 2)
        ck.flush()
        _damage(ck.tier.step_dir(2) / "rank_0.bin")
        with pytest.raises(RestoreRefused, match="back past step 2"):
            ck.load(empty_state(0))
        got = empty_state(0)
        assert ck.load(got, step=1) == 1  # an explicit older step is the user's choice


@pytest.mark.slow
def test_a_stale_save_of_one_rank_is_refused_by_every_rank_and_all_load_the_step_before(tmp_path: Path) -> None:
    """Two ranks on two 'nodes': rank 1's save of step 3 repeats its step 2; rank 1 flags it, and the load (a
    collective) refuses step 3 on both ranks alike and restores step 2 exactly."""
    saved = run_ranks(tmp_path, "save", steps=[1, 2, 3], stale_step=3, cfg={"keep": 3})
    assert [r.get("stale") for r in saved] == [[], [3]], saved
    res = run_ranks(tmp_path, "load", cfg={"keep": 3})
    assert [(r.get("step"), r.get("match")) for r in res] == [(2, True), (2, True)], res
