"""DCP's contract kept by the tier writer/reader and the checkpointer (issue 17, items 2-6)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from structlog.testing import capture_logs
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from hpresilience.torch import (
    CheckpointConfig,
    MemoryTier,
    TieredCheckpointer,
    TierStorageReader,
    TierStorageWriter,
)
from hpresilience.torch.export import export_torch_save
from tests.torch._workers import empty_state, matches, state_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@dataclasses.dataclass
class RunInfo:
    name: str
    seen: int


def _ckpt(tmp_path: Path, **kw: object) -> TieredCheckpointer:
    return TieredCheckpointer(CheckpointConfig(namespace="job", memory_dir=str(tmp_path), **kw))  # type: ignore[arg-type]


def test_reader_loads_the_step_named_by_checkpoint_id_not_the_one_it_was_built_for(tmp_path: Path) -> None:
    tier = MemoryTier(tmp_path, "ns")
    for s in (1, 2):
        dcp_save(state_for(s, 0), storage_writer=TierStorageWriter(tier, s, tier_only=True))
    reader = TierStorageReader(tier.step_dir(1))
    got = empty_state(0)
    dcp_load(got, checkpoint_id=str(tier.step_dir(2)), storage_reader=reader)
    assert matches(got, 2, 0)
    got = empty_state(0)
    dcp_load(got, checkpoint_id="tier://ns/1", storage_reader=reader)
    assert matches(got, 1, 0)


@pytest.mark.parametrize("background", [False, True])
def test_async_save_accepts_the_leaf_types_dcp_save_accepts(tmp_path: Path, background: bool) -> None:
    """A dataclass and a set in the state dict: dcp.save takes them, so async_save must too."""
    with _ckpt(tmp_path, background_staging=background) as ck:
        state: dict[str, Any] = {"w": torch.arange(6.0), "info": RunInfo("a", 3), "tags": {"x", "y"}}
        ck.async_save(state, 1).result()
        state["info"].seen = 99  # changed after the call: the checkpoint keeps the value at the call
        ck.flush()
        got: dict[str, Any] = {"w": torch.zeros(6), "info": RunInfo("", 0), "tags": set()}
        assert ck.load(got) == 1
        assert torch.equal(got["w"], torch.arange(6.0))
        assert got["info"] == RunInfo("a", 3) and got["tags"] == {"x", "y"}


def _raise(_rank: int) -> None:
    raise OSError(28, "No space left on device")


def test_failed_save_returns_false_from_wait_and_leaves_no_partial_shard(tmp_path: Path) -> None:
    with _ckpt(tmp_path, keep=1) as ck:
        ck.save(state_for(1, 0), 1)
        ck.flush()
        ck.fault_hook = _raise
        ck.async_save(state_for(2, 0), 2)
        assert ck.wait() is False  # documented: False, not a CheckpointException from the next call
        d2 = ck.tier.step_dir(2)
        assert not (d2 / "rank_0.bin.tmp").exists()
        ck.fault_hook = None
        ck.async_save(state_for(3, 0), 3).result()
        ck.flush()
        got = empty_state(0)
        assert ck.load(got) == 3 and matches(got, 3, 0)


def test_partial_shard_of_a_killed_save_is_pruned_once_a_newer_step_commits(tmp_path: Path) -> None:
    with _ckpt(tmp_path, keep=1) as ck:
        ck.save(state_for(1, 0), 1)
        ck.flush()
        d2 = ck.tier.step_dir(2)
        d2.mkdir()
        (d2 / "rank_0.bin.tmp").write_bytes(b"x" * 4096)  # what a kill between write and rename leaves
        ck.save(state_for(3, 0), 3)
        ck.flush()
        assert not d2.exists()
        assert ck.tier.steps() == [3]


def test_loading_an_older_step_on_purpose_does_not_warn_about_newer_ones(tmp_path: Path) -> None:
    with _ckpt(tmp_path, keep=3) as ck:
        for s in (1, 2, 3):
            ck.save(state_for(s, 0), s)
        ck.flush()
        with capture_logs() as logs:
            assert ck.load(empty_state(0), step=2) == 2
        assert not [e for e in logs if e["event"] == "checkpoint_newer_steps_ignored"]


def test_committed_step_exports_to_a_plain_torch_save_file(tmp_path: Path) -> None:
    tier = MemoryTier(tmp_path, "ns")
    state = state_for(5, 0)
    dcp_save(state, storage_writer=TierStorageWriter(tier, 5, tier_only=True))
    out = tmp_path / "full.pt"
    export_torch_save(tier.step_dir(5), out)
    got = torch.load(out, weights_only=False)
    assert torch.equal(got["shared"]["w"], state["shared"]["w"])
    assert torch.equal(got["local_0"], state["local_0"])
    assert got["meta"] == {"step": 5, "note": "s5"}
    assert os.path.getsize(out) > 0


def test_raw_tier_writer_refuses_to_pose_as_the_full_tiered_checkpoint(tmp_path: Path) -> None:
    """Passed to DCP on its own, the memory-tier writer would give no peer copy, S3 or retention."""
    tier = MemoryTier(tmp_path, "ns")
    with pytest.raises(BaseException, match="only the memory tier"):
        dcp_save(state_for(1, 0), storage_writer=TierStorageWriter(tier, 1))
    assert not tier.step_dir(1).exists()
