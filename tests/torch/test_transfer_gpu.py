"""A survivor's state sent to new ranks whose model lives on a CUDA GPU (needs a GPU; skipped without): over gloo,
which moves host memory only, every unit goes through the pinned staging buffers of transfer.py on both sides.
Both ranks share the one GPU (gloo allows it; NCCL refuses two ranks on one device)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.torch.test_transfer import run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]


@pytest.mark.parametrize("unit_bytes", [16 << 20, 64], ids=["whole-tensors", "packed-and-sliced-in-64-byte-units"])
def test_new_ranks_with_a_gpu_model_receive_the_survivors_state_bit_for_bit(tmp_path: Path, unit_bytes: int) -> None:
    res = run(tmp_path, 3, width=24, unit_bytes=unit_bytes, device="cuda")
    assert not [r["error"] for r in res if "error" in r], res
    assert all(r["devices"] == ["cuda"] for r in res), res
    assert res[0]["received_digest"] == res[1]["received_digest"] == res[2]["received_digest"]
    assert res[0]["after_step_digest"] == res[1]["after_step_digest"] == res[2]["after_step_digest"]
