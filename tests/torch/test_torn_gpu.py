"""Background staging of state that lives on a CUDA GPU, the case it exists for (needs a GPU; skipped without).

Found on a real H100: the guard compared each host copy with its GPU source through torch.equal, which refuses
two devices, so every background save of GPU state failed with a RuntimeError instead of committing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from hpresilience.torch import CheckpointConfig, TieredCheckpointer, TornStateError
from tests.torch.test_torn import _data, _model, _slow, _snapshot

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]


def _bg(tmp_path: Path) -> TieredCheckpointer:
    return TieredCheckpointer(
        CheckpointConfig(
            namespace="g",
            memory_dir=str(tmp_path),
            keep=3,
            replicate=False,
            background_staging=True,
            inline_staging_below_mib=0,
        )
    )


def test_background_save_of_gpu_state_commits_and_loads_back_bit_for_bit(tmp_path: Path) -> None:
    m = _model(8).cuda()
    before = {k: v.cpu() for k, v in _snapshot(m).items()}
    with _bg(tmp_path) as ck:
        ck.async_save({"model": m.state_dict()}, 1).result()
        assert ck.flush(30)
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(7.0)
        target = {"model": m.state_dict()}
        assert ck.load(target, 1) == 1
    assert all(torch.equal(v.cpu(), before[k]) for k, v in m.state_dict().items())


def test_a_data_write_to_gpu_state_meeting_the_background_copy_fails_the_save(tmp_path: Path) -> None:
    m = _model(16).cuda()
    with _bg(tmp_path) as ck:
        copied = _slow(ck._stager, 0.05)
        fut = ck.async_save({"model": m.state_dict()}, 1)
        deadline = time.monotonic() + 10
        while copied[0] < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
        _data(m)
        with pytest.raises(TornStateError):
            fut.result()
