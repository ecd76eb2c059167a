"""The memory-tier reader's fast path: straight into the caller's tensors, several items at once, each
hashed piece by piece as it lands (hpresilience/torch/reader.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from hpresilience.torch import MemoryTier, TierStorageReader, TierStorageWriter, storage
from hpresilience.torch import reader as reader_mod

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

MIB = 1 << 20

# Loads a 64 MiB tensor into a touched target in a fresh process; prints where the bytes landed and how far
# the process's peak resident memory rose above its resident memory before the load (Linux: writing 5 to
# clear_refs resets the peak, VmHWM). A tiny load first brings in every module the load imports.
_LOAD_AND_MEASURE = """
import json, sys
import torch
from torch.distributed.checkpoint.state_dict_loader import load
from hpresilience.torch import TierStorageReader
big, small = sys.argv[1], sys.argv[2]
load({"w": torch.zeros(16), "b": torch.zeros(3)}, storage_reader=TierStorageReader(small))
target = {"w": torch.zeros(16 * 1024 * 1024), "b": torch.zeros(3)}
w, ptr = target["w"], target["w"].data_ptr()
def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = kib("VmRSS")
load(target, storage_reader=TierStorageReader(big))
rise_kib = kib("VmHWM") - before
print(json.dumps({"same_tensor": target["w"] is w, "same_storage": target["w"].data_ptr() == ptr,
                  "rise_mib": rise_kib / 1024, "sum": float(target["w"].sum()), "b": target["b"].tolist()}))
"""


def _save(tier: MemoryTier, step: int, state: dict[str, Any], **kw: Any) -> Path:
    dcp_save(state, storage_writer=TierStorageWriter(tier, step, tier_only=True, **kw))
    return tier.step_dir(step)


def test_restore_lands_in_the_callers_tensors_with_no_second_copy_of_the_bytes(tmp_path: Path) -> None:
    """A restore into existing CPU tensors reads the shard into their memory: the same tensor and storage
    afterwards, and the process's peak memory does not rise by the checkpoint's size (a read into a fresh
    buffer and a copy from it, or a bytes object per item, would add the item's 64 MiB)."""
    tier = MemoryTier(tmp_path, "ns")
    big = _save(tier, 2, {"w": torch.full((16 * MIB,), 0.5), "b": torch.tensor([1.0, 2.0, 3.0])})
    small = _save(tier, 1, {"w": torch.ones(16), "b": torch.zeros(3)})
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_MEASURE, str(big), str(small)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["same_tensor"] and got["same_storage"]
    assert got["sum"] == 0.5 * 16 * MIB and got["b"] == [1.0, 2.0, 3.0]
    assert got["rise_mib"] < 16, f"peak memory rose {got['rise_mib']:.0f} MiB while loading a 64 MiB tensor"


def test_restore_reads_several_items_at_once_in_threads_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The items are read concurrently (one thread reading while another hashes ran at a third of a
    memcpy); DCP's calling thread does not read them one by one."""
    tier = MemoryTier(tmp_path, "ns")
    state = {f"p{i}": torch.full((MIB // 4,), float(i)) for i in range(6)}
    step_dir = _save(tier, 1, state)
    active, most, lock = 0, 0, threading.Lock()
    readers: set[int] = set()
    real = storage._pread_into

    def slow_pread(*args: Any) -> None:
        nonlocal active, most
        with lock:
            active += 1
            most = max(most, active)
            readers.add(threading.get_ident())
        time.sleep(0.05)  # long enough that a second reader, if any, starts meanwhile
        real(*args)
        with lock:
            active -= 1

    monkeypatch.setattr(reader_mod, "_pread_into", slow_pread)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp_load(target, storage_reader=TierStorageReader(step_dir))
    assert all(torch.equal(target[k], state[k]) for k in state)
    assert most >= 2, "the items were read one at a time"
    assert threading.get_ident() not in readers


@pytest.mark.parametrize("algo", ["xxh3_64", "crc32"])
def test_a_flipped_byte_past_the_first_piece_of_a_large_item_is_caught(tmp_path: Path, algo: str) -> None:
    """The checksum is computed piece by piece as the bytes land: damage in a later piece of an item several
    pieces long fails the load as a whole-item checksum would; undamaged, the same item loads."""
    tier = MemoryTier(tmp_path, "ns")
    state = {"w": torch.randn(3 * MIB // 4 + 5), "b": torch.arange(4)}
    step_dir = _save(tier, 1, state, algo=algo)
    target = {"w": torch.zeros_like(state["w"]), "b": torch.zeros_like(state["b"])}
    dcp_load(target, storage_reader=TierStorageReader(step_dir))
    assert torch.equal(target["w"], state["w"]) and torch.equal(target["b"], state["b"])
    idx = json.loads((step_dir / "rank_0.idx").read_bytes())
    w = next(i for i in idx["items"] if i["fqn"] == "w")
    data = step_dir / "rank_0.bin"
    raw = bytearray(data.read_bytes())
    raw[w["offset"] + 2 * MIB + 7] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointException) as err:
        dcp_load(target, storage_reader=TierStorageReader(step_dir))
    assert "checksum mismatch in w" in repr(err.value.failures[0])
