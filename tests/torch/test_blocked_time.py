"""Time training waits on a checkpoint reaches the goodput ledger (heartbeat `ckpt_s`/`restore_s`) by every
path the library offers: DCP's own calls with its writer and reader, HyperPod's drop-in classes, flush and
close, and the staging waits. Nested calls (close flushes, load flushes) count once (issue 32)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import StorageWriter

from hpresilience.torch import CheckpointConfig, TieredCheckpointer, heartbeat
from hpresilience.torch.hyperpod import (
    SageMakerCheckpointConfig,
    SageMakerTieredStorageReader,
    SageMakerTieredStorageWriter,
)
from hpresilience.torch.hyperpod import flush as hyperpod_flush
from tests.torch._workers import empty_state, matches, state_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _async_save(state: dict[str, Any], writer: StorageWriter) -> Future[Any]:
    resp = dcp_async_save(state, storage_writer=writer)
    assert isinstance(resp, Future)
    return resp


class Recorded(heartbeat.Heartbeat):
    """The process's heartbeat under the wrapper, recording each blocked-time report."""

    def __init__(self) -> None:
        super().__init__(env={heartbeat.JOB_ENV: "5", "HPR_HEARTBEAT_EVERY_S": "3600"}, fd=os.open(os.devnull, 1))
        self._installed = True  # no stack signal in the test process
        self.reports: list[tuple[str, float]] = []

    def blocked(self, kind: Any, seconds: float) -> None:
        self.reports.append((kind, seconds))
        super().blocked(kind, seconds)

    def take(self) -> list[str]:
        kinds = [k for k, s in self.reports if s >= 0]
        self.reports.clear()
        return kinds


@pytest.fixture
def hb(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorded]:
    rec = Recorded()
    monkeypatch.setattr(heartbeat, "_default", rec)
    yield rec


def test_dcp_save_and_async_save_with_the_checkpointers_writer_report_checkpoint_time(
    tmp_path: Path, hb: Recorded
) -> None:
    with TieredCheckpointer(CheckpointConfig(namespace="w", memory_dir=str(tmp_path), replicate=False)) as ck:
        dcp_save(state_for(1, 0), storage_writer=ck.storage_writer(1))
        assert hb.take() == ["checkpoint"]  # DCP's whole call, once
        fut = _async_save(state_for(2, 0), ck.storage_writer(2))
        assert hb.take() == ["checkpoint"]  # the staging copy in the call; the write runs behind it
        fut.result()
        time.sleep(0.1)
        assert hb.take() == []  # the worker thread's calls are not training's wait
        assert ck.flush() is True
        assert hb.take() == ["checkpoint"]
        got = empty_state(0)
        prepared = ck.prepare_load(2)
        assert prepared is not None
        dcp_load(got, storage_reader=prepared[1])
        ck.finish_load(2)
        assert matches(got, 2, 0)
        assert hb.take() == ["restore", "restore", "restore"]  # prepare_load, read_data, finish_load
    assert hb.take() == ["checkpoint"]  # close(), which flushes inside: once


def test_hyperpod_writer_reader_and_flush_report_their_time(
    tmp_path: Path, hb: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API the README offers HyperPod users showed 0 s in the ledger."""
    monkeypatch.setenv("HPRESILIENCE_MEMORY_DIR", str(tmp_path / "shm"))
    conf = SageMakerCheckpointConfig(namespace="hpb", world_size=1)
    w = SageMakerTieredStorageWriter(checkpoint_config=conf, step=10)
    fut = _async_save(state_for(10, 0), w)
    assert hb.take() == ["checkpoint"]
    fut.result()
    hyperpod_flush()
    assert hb.take() == ["checkpoint"]
    got = empty_state(0)
    dcp_load(got, storage_reader=SageMakerTieredStorageReader(checkpoint_config=conf))
    assert matches(got, 10, 0)
    assert hb.take() == ["restore", "restore"]  # finding and verifying the step; reading it
    w.ck.close()


def test_load_and_close_count_their_inner_flush_once(tmp_path: Path, hb: Recorded) -> None:
    ck = TieredCheckpointer(CheckpointConfig(namespace="n", memory_dir=str(tmp_path), replicate=False))
    ck.save(state_for(1, 0), 1)
    assert hb.take() == ["checkpoint"]
    assert ck.load(empty_state(0)) == 1
    assert hb.take() == ["restore"]
    assert ck.close() is True
    assert hb.take() == ["checkpoint"]


def test_staging_waits_before_a_forward_and_wait_staged_report_checkpoint_time(tmp_path: Path, hb: Recorded) -> None:
    cfg = CheckpointConfig(namespace="s", memory_dir=str(tmp_path), replicate=False, background_staging=True)
    with TieredCheckpointer(cfg) as ck:
        model = nn.Linear(512, 512)  # 1 MiB of weight: copied in the background
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        orig = ck._stager._copy
        release = threading.Event()

        def held(pairs: Any, view: Any) -> Any:
            release.wait(30)  # the copy ends only once training is waiting for it
            return orig(pairs, view)

        ck._stager._copy = held  # type: ignore[method-assign]
        for step, wait in ((1, "forward"), (2, "wait_staged")):
            release.clear()
            fut = ck.async_save({"model": model.state_dict()}, step)
            hb.take()
            threading.Timer(0.3, release.set).start()
            if wait == "forward":
                model(torch.randn(2, 512)).sum().backward()  # the forward's pre-hook waits for the copy
                opt.step()
            else:
                assert ck.wait_staged() > 0
            assert hb.take() == ["checkpoint"], (wait, hb.reports)
            fut.result()
