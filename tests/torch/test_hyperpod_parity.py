"""What a user porting from SageMaker HyperPod's managed tiered checkpointing meets (issue 17, parity)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save
from torch.distributed.checkpoint.storage import StorageWriter

from hpresilience.errors import ConfigError
from hpresilience.torch import CheckpointConfig, TieredCheckpointer
from hpresilience.torch.hyperpod import (
    SageMakerCheckpointConfig,
    SageMakerTieredStorageReader,
    SageMakerTieredStorageWriter,
)
from tests.torch._workers import empty_state, matches, state_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _async_save(state: dict[str, Any], *, storage_writer: StorageWriter) -> Future[Any]:
    """dcp.async_save as a trainer calls it; without an async stager it returns a plain future."""
    resp = async_save(state, storage_writer=storage_writer)
    assert isinstance(resp, Future)
    return resp


def _ckpt(tmp_path: Path, **kw: object) -> TieredCheckpointer:
    return TieredCheckpointer(CheckpointConfig(namespace="job", memory_dir=str(tmp_path), **kw))  # type: ignore[arg-type]


def test_hyperpod_config_names_are_accepted_as_aliases() -> None:
    cfg = CheckpointConfig(namespace="n", s3_tier_base_path="s3://b/p", save_to_s3=True)  # type: ignore[call-arg]
    assert cfg.s3_base == "s3://b/p" and cfg.s3_every == 1
    with pytest.raises(ValueError, match="disagree"):
        CheckpointConfig(namespace="n", s3_base="s3://a", s3_tier_base_path="s3://b")  # type: ignore[call-arg]


def test_per_save_to_s3_overrides_the_cadence_both_ways(tmp_path: Path, s3_endpoint: str) -> None:
    cfg = {"s3_base": "s3://ckpt/override", "s3_every": 2, "s3_endpoint_url": s3_endpoint, "keep": 5}
    with _ckpt(tmp_path, **cfg) as ck:
        ck.save(state_for(1, 0), 1, to_s3=True)  # the preemption save: forced up although 1 % 2 != 0
        ck.async_save(state_for(2, 0), 2, to_s3=False).result()  # due by cadence, skipped on request
        ck.save(state_for(4, 0), 4)
        ck.flush()
        assert ck.durable is not None and ck.durable.committed_steps() == [1, 4]


def test_to_s3_without_an_s3_tier_is_refused(tmp_path: Path) -> None:
    with _ckpt(tmp_path) as ck, pytest.raises(ConfigError, match="no durable tier"):
        ck.save(state_for(1, 0), 1, to_s3=True)


def test_writer_from_the_checkpointer_given_to_dcp_async_save_carries_s3_and_retention(
    tmp_path: Path, s3_endpoint: str
) -> None:
    cfg = {"s3_base": "s3://ckpt/direct", "s3_endpoint_url": s3_endpoint, "keep": 1}
    with _ckpt(tmp_path / "a", **cfg) as ck:
        for s in (1, 2, 3):
            _async_save(state_for(s, 0), storage_writer=ck.storage_writer(s, to_s3=s == 2)).result()
            ck.flush()  # an upload in progress pins its step; flushing lets the next commit prune it
        assert ck.tier.steps() == [3]  # retention ran: keep=1
        assert ck.durable is not None and ck.durable.committed_steps() == [2]
    with _ckpt(tmp_path / "b", **cfg) as ck2:
        got = empty_state(0)
        assert ck2.load(got) == 2 and ck2.last_source == "s3" and matches(got, 2, 0)


def test_hyperpod_reader_finds_the_latest_step_itself_and_raises_when_there_is_none(
    tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPRESILIENCE_MEMORY_DIR", str(tmp_path / "shm"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    conf = SageMakerCheckpointConfig(namespace="hp1", world_size=1, s3_tier_base_path="s3://ckpt/hp")
    with pytest.raises(BaseException, match="no checkpoint of namespace 'hp1'"):
        dcp_load(empty_state(0), storage_reader=SageMakerTieredStorageReader(checkpoint_config=conf))
    for s in (10, 20):
        conf.save_to_s3 = s == 10
        w = SageMakerTieredStorageWriter(checkpoint_config=conf, step=s)
        _async_save(state_for(s, 0), storage_writer=w).result()
    assert w.s3_checkpoint_dir.endswith("/hp/hp1/step_0000000020")
    reader = SageMakerTieredStorageReader(checkpoint_config=conf)
    got = empty_state(0)
    dcp_load(got, storage_reader=reader)
    assert reader.loaded_step == 20 and matches(got, 20, 0)
    got = empty_state(0)
    dcp_load(got, storage_reader=SageMakerTieredStorageReader(checkpoint_config=conf, step=10))
    assert matches(got, 10, 0)
    assert reader.ck.durable is not None and reader.ck.durable.committed_steps() == [10]
    # A damaged newest shard: dcp.load cannot retry, so the reader checks first and takes step 10.
    shard = reader.ck.tier.step_dir(20) / "rank_0.bin"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    reader = SageMakerTieredStorageReader(checkpoint_config=conf)
    got = empty_state(0)
    dcp_load(got, storage_reader=reader)
    assert reader.loaded_step == 10 and matches(got, 10, 0)


def test_hyperpod_writer_takes_its_step_from_a_path_and_refuses_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPRESILIENCE_MEMORY_DIR", str(tmp_path / "shm"))
    conf = SageMakerCheckpointConfig(namespace="hp2", world_size=1)
    assert SageMakerTieredStorageWriter(conf, path="run/step_42/checkpoint").step == 42
    with pytest.raises(ConfigError, match="invalid step"):
        SageMakerTieredStorageWriter(conf, path="run/latest")
    conf.save_to_s3 = True
    with pytest.raises(ConfigError, match="s3_tier_base_path"):
        SageMakerTieredStorageWriter(conf, step=1)
    torch.manual_seed(0)
