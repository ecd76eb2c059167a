"""A survivor's state sent to new ranks tensor by tensor (hpresilience/torch/transfer.py), with real gloo groups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.torch._transfer_ranks import body
from tests.torch._workers import _rank, rendezvous_file, start_and_join


def run(base: Path, world: int, **kw: Any) -> list[dict[str, Any]]:
    rendezvous = rendezvous_file(base)
    procs = [_rank(body, r, world, rendezvous, str(base), kw) for r in range(world)]
    start_and_join(procs, 60)
    results = []
    for r in range(world):
        f = base / f"transfer_{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else {"error": f"no result (exit {procs[r].exitcode})"})
    return results


@pytest.mark.slow  # several ranks
@pytest.mark.parametrize("unit_bytes", [16 << 20, 64], ids=["whole-tensors", "packed-and-sliced-in-64-byte-units"])
def test_new_ranks_receive_model_buffers_extra_state_and_adam_moments_bit_for_bit(
    tmp_path: Path, unit_bytes: int
) -> None:
    """The receivers start from a fresh build (other weights, no optimizer state); after the transfer their
    whole state (the tied weight under both its names too) hashes as the survivor's, and one more step on the
    same batch keeps them equal."""
    res = run(tmp_path, 3, width=24, unit_bytes=unit_bytes)
    assert not [r["error"] for r in res if "error" in r], res
    assert res[1]["step"] == res[2]["step"] == 42
    assert res[0]["received_digest"] == res[1]["received_digest"] == res[2]["received_digest"]
    assert res[0]["after_step_digest"] == res[1]["after_step_digest"] == res[2]["after_step_digest"]
    assert [r["lr"] for r in res] == [0.004] * 3 and [r["tag"] for r in res] == ["trained"] * 3
    assert all(r["tied"] for r in res)  # the tied weight, sent once, is still one tensor under both names


@pytest.mark.slow  # several ranks
def test_a_receiver_whose_model_differs_refuses_with_the_tensor_named_and_nothing_hangs(tmp_path: Path) -> None:
    """Rank 1's model is one unit wider: it refuses before any byte is sent and keeps its own state; the source
    goes on to rank 2, which receives as usual."""
    res = run(tmp_path, 3, width=8, different=(1,))
    assert not [r["error"] for r in res if "error" in r], res
    # The first difference in state_dict order, with both shapes.
    assert res[1]["refused"] == "turned: (3, 9) torch.float32 here, (3, 8) torch.float32 at the source", res[1]
    assert res[1]["tag"] == "" and res[1]["lr"] == 0.01
    assert res[2]["received_digest"] == res[0]["received_digest"]
