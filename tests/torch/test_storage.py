"""The memory-tier DCP writer/reader and the single-process checkpointer (no process group)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from hpresilience.errors import ConfigError
from hpresilience.torch import (
    CheckpointConfig,
    MemoryTier,
    TieredCheckpointer,
    TierStorageReader,
    TierStorageWriter,
)
from hpresilience.torch.s3tier import S3Tier
from tests.torch._workers import empty_state, matches, state_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _flip(path: Path, at: int | None = None) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 if at is None else at] ^= 0x40
    path.write_bytes(bytes(raw))


def test_writer_stores_raw_tensor_bytes_with_index_and_commit_written_last(tmp_path: Path) -> None:
    tier = MemoryTier(tmp_path, "ns")
    state = state_for(4, 0)
    dcp_save(state, storage_writer=TierStorageWriter(tier, 4, tier_only=True))
    d = tier.step_dir(4)
    assert sorted(os.listdir(d)) == [".metadata", "COMMIT", "rank_0.bin", "rank_0.idx"]
    idx = json.loads((d / "rank_0.idx").read_bytes())
    w = next(i for i in idx["items"] if i["fqn"] == "shared.w")
    raw = (d / "rank_0.bin").read_bytes()[w["offset"] : w["offset"] + w["length"]]
    # Raw bytes, not a torch.save blob: the region is exactly the tensor's memory.
    assert raw == state["shared"]["w"].numpy().tobytes()
    assert json.loads((d / "COMMIT").read_bytes())["step"] == 4


def test_reader_round_trips_tensors_and_python_objects(tmp_path: Path) -> None:
    tier = MemoryTier(tmp_path, "ns")
    dcp_save(state_for(4, 0), storage_writer=TierStorageWriter(tier, 4, tier_only=True))
    got = empty_state(0)
    dcp_load(got, storage_reader=TierStorageReader(tier.step_dir(4)))
    assert matches(got, 4, 0)


def test_reader_detects_a_flipped_byte_by_checksum(tmp_path: Path) -> None:
    tier = MemoryTier(tmp_path, "ns")
    dcp_save(state_for(4, 0), storage_writer=TierStorageWriter(tier, 4, tier_only=True))
    _flip(tier.step_dir(4) / "rank_0.bin")
    with pytest.raises(CheckpointException) as err:
        dcp_load(empty_state(0), storage_reader=TierStorageReader(tier.step_dir(4)))
    assert "ChecksumError" in repr(err.value.failures[0])
    assert "checksum mismatch in shared.w" in repr(err.value.failures[0])


def _ckpt(tmp_path: Path, **kw: object) -> TieredCheckpointer:
    return TieredCheckpointer(CheckpointConfig(namespace="job", memory_dir=str(tmp_path), **kw))  # type: ignore[arg-type]


def test_damaged_newest_step_is_skipped_and_previous_one_loaded(tmp_path: Path) -> None:
    with _ckpt(tmp_path, keep=3) as ck:
        ck.save(state_for(1, 0), 1)
        ck.async_save(state_for(2, 0), 2).result()
        ck.flush()
        _flip(ck.tier.step_dir(2) / "rank_0.bin")
        got = empty_state(0)
        assert ck.load(got) == 1
        assert matches(got, 1, 0)


def test_step_without_commit_marker_is_never_loaded(tmp_path: Path) -> None:
    with _ckpt(tmp_path) as ck:
        ck.save(state_for(1, 0), 1)
        ck.save(state_for(2, 0), 2)
        ck.flush()
        (ck.tier.step_dir(2) / "COMMIT").unlink()  # as if the coordinator died before finishing
        got = empty_state(0)
        assert ck.load(got) == 1 and matches(got, 1, 0)
        assert ck.load(empty_state(0), step=2) is None


def test_nothing_saved_loads_nothing(tmp_path: Path) -> None:
    with _ckpt(tmp_path) as ck:
        state = empty_state(0)
        assert ck.load(state) is None
        assert state["meta"]["step"] == -1


def test_old_steps_go_only_after_a_newer_step_committed(tmp_path: Path) -> None:
    with _ckpt(tmp_path, keep=2) as ck:
        for s in (1, 2):
            ck.save(state_for(s, 0), s)
        ck.flush()
        # A step that never commits (crash before the marker) must not push committed ones out.
        d3 = ck.tier.step_dir(3)
        d3.mkdir()
        (d3 / "rank_0.bin").write_bytes(b"partial")
        assert ck.tier.prune(0, 3, keep=2) == []
        assert ck.tier.steps() == [1, 2, 3]
        ck.save(state_for(4, 0), 4)
        ck.flush()
        assert ck.tier.steps() == [2, 4]
        assert ck.load(empty_state(0), step=2) == 2


def test_pruned_shard_file_is_reused_for_the_next_save(tmp_path: Path) -> None:
    with _ckpt(tmp_path, keep=1) as ck:
        ck.save(state_for(1, 0), 1)
        ck.save(state_for(2, 0), 2)
        ck.flush()
        spare = ck.tier.spare(0)
        ino = spare.stat().st_ino
        ck.save(state_for(3, 0), 3)
        ck.flush()
        assert (ck.tier.step_dir(3) / "rank_0.bin").stat().st_ino == ino
        got = empty_state(0)
        assert ck.load(got) == 3 and matches(got, 3, 0)


def test_too_small_memory_tier_fails_at_start_with_the_numbers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"too small.*keep 2 \+ 1 in flight"):
        _ckpt(tmp_path, shard_gib=1 << 20)


def test_single_process_s3_tier_upload_then_restore(tmp_path: Path, s3_endpoint: str) -> None:
    cfg = {"s3_base": "s3://ckpt/single", "s3_every": 2, "s3_endpoint_url": s3_endpoint}
    with _ckpt(tmp_path / "a", **cfg) as ck:
        for s in (1, 2, 3):
            ck.save(state_for(s, 0), s)
        ck.flush()
        assert ck.durable is not None and ck.durable.committed_steps() == [2]
    with _ckpt(tmp_path / "b", **cfg) as ck2:  # a fresh node: empty memory tier
        got = empty_state(0)
        assert ck2.load(got) == 2 and ck2.last_source == "s3" and matches(got, 2, 0)


def test_s3_copy_with_a_flipped_byte_is_refused(tmp_path: Path, s3_endpoint: str) -> None:
    cfg = {"s3_base": "s3://ckpt/flip", "s3_every": 1, "s3_endpoint_url": s3_endpoint}
    with _ckpt(tmp_path / "a", **cfg) as ck:
        ck.save(state_for(1, 0), 1)
        ck.flush()
        assert isinstance(ck.durable, S3Tier)
        key = ck.durable.key(1, "rank_0.bin")
        body = bytearray(ck.durable.client.get_object(Bucket="ckpt", Key=key)["Body"].read())
        body[5] ^= 0x01
        ck.durable.client.put_object(Bucket="ckpt", Key=key, Body=bytes(body))
    with _ckpt(tmp_path / "b", **cfg) as ck2:
        assert ck2.load(empty_state(0)) is None


def test_reader_refuses_unknown_checksum_algorithm(tmp_path: Path) -> None:
    tier = MemoryTier(tmp_path, "ns")
    dcp_save(state_for(1, 0), storage_writer=TierStorageWriter(tier, 1, algo="crc32", tier_only=True))
    idx = tier.step_dir(1) / "rank_0.idx"
    idx.write_text(idx.read_text().replace('"crc32"', '"md4"'))
    with pytest.raises(CheckpointException) as err:
        dcp_load(empty_state(0), storage_reader=TierStorageReader(tier.step_dir(1)))
    assert "unknown checksum algorithm 'md4'" in repr(err.value.failures[0])


def test_tensors_are_not_shared_with_later_training_updates(tmp_path: Path) -> None:
    """async_save stages a copy: changing the live tensors after the call must not change the checkpoint."""
    with _ckpt(tmp_path) as ck:
        state = state_for(1, 0)
        fut = ck.async_save(state, 1)
        state["shared"]["w"].add_(100.0)
        fut.result()
        ck.flush()
        got = empty_state(0)
        assert ck.load(got) == 1 and matches(got, 1, 0)
