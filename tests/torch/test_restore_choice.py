"""Which step a restart loads, and from where: identical pure logic on every rank."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from hpresilience.torch.restore import choose_step
from hpresilience.torch.settings import CheckpointConfig


def inv(own: list[int], committed: list[int], held: dict[int, list[int]] | None = None) -> dict[str, Any]:
    return {"own": own, "committed": committed, "held": held or {}}


def test_newest_step_that_every_rank_has_wins() -> None:
    invs = [inv([1, 2, 3], [1, 2, 3]), inv([1, 2], [1, 2])]
    assert choose_step(invs, set(), set(), 2) == (2, [("own", 0), ("own", 1)])


def test_uncommitted_step_is_never_chosen_even_if_all_shards_exist() -> None:
    invs = [inv([1, 2], [1]), inv([1, 2], [1])]
    assert choose_step(invs, set(), set(), 2) == (1, [("own", 0), ("own", 1)])


def test_a_rank_without_memory_takes_the_peer_copy_then_s3() -> None:
    invs = [inv([4], [4], held={1: [4]}), inv([], [])]
    assert choose_step(invs, {2}, set(), 2) == (4, [("own", 0), ("peer", 0)])
    bad = {(1, ("peer", 0), 4)}
    assert choose_step(invs, {4}, bad, 2) == (4, [("own", 0), ("s3", -1)])


def test_falls_back_to_s3_step_when_memory_cannot_serve_all_ranks() -> None:
    invs = [inv([5], [5]), inv([], [])]
    assert choose_step(invs, {3}, set(), 2) == (3, [("s3", -1), ("s3", -1)])


def test_explicit_step_and_nothing_loadable() -> None:
    invs = [inv([1, 2], [1, 2])]
    assert choose_step(invs, set(), set(), 1, wanted=1) == (1, [("own", 0)])
    assert choose_step(invs, set(), set(), 1, wanted=7) is None
    assert choose_step([inv([], [])], set(), set(), 1) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"namespace": "a/b"},
        {"namespace": ""},
        {"namespace": "x", "s3_base": "bucket/p"},
        {"namespace": "x", "s3_every": 10},
        {"namespace": "x", "keep": 0},
        {"namespace": "x", "surprise": 1},
    ],
)
def test_bad_checkpoint_settings_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CheckpointConfig(**bad)


def test_s3_base_splits_into_bucket_and_prefix() -> None:
    cfg = CheckpointConfig(namespace="j", s3_base="s3://bkt/a/b/")
    assert cfg.s3_bucket_prefix() == ("bkt", "a/b")


def test_ranks_per_node_defaults_from_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4(x2)")
    assert CheckpointConfig(namespace="j").local_ranks() == 4
    assert CheckpointConfig(namespace="j", ranks_per_node=2).local_ranks() == 2
