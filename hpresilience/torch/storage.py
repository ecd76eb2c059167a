"""torch.distributed.checkpoint StorageWriter/StorageReader over the node memory tier.

A rank's shard is one file of raw tensor bytes (no torch.save per tensor) plus a JSON index with each item's
offset, length, dtype, shape and checksum. The coordinator writes `.metadata` and then COMMIT in `finish()`:
a step without COMMIT was never completed and is never loaded.

Replicated items (the same tensor on several ranks, as in DDP) are deduplicated in the DCP metadata, but
each rank also writes its own copy into its shard and index. A restarted rank then finds everything it
needs on its own node instead of in another node's memory.
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import os
import pickle
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from hpresilience.fileio import atomic_write
from hpresilience.torch.layout import (
    DEFAULT_ALGO,
    METADATA,
    ChecksumError,
    ItemLoc,
    MemoryTier,
    ShardIndex,
    hasher,
    shard_names,
)
from hpresilience.torch.private import open_private

SCHEME = "tier://"
_DTYPES = {
    str(d): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def _dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        d = getattr(torch, name.removeprefix("torch."), None)
        if not isinstance(d, torch.dtype):
            raise ChecksumError(f"unknown dtype {name!r} in shard index") from None
        return d


def _key(index: MetadataIndex) -> tuple[str, tuple[int, ...] | None]:
    return index.fqn, tuple(index.offset) if index.offset is not None else None


def step_from_id(checkpoint_id: str | os.PathLike[str]) -> int:
    text = str(checkpoint_id)
    tail = text.rstrip("/").rsplit("/", 1)[-1]
    tail = tail.removeprefix("step_")
    if not tail.isdigit():
        raise ValueError(f"checkpoint id {text!r} does not end in a step number")
    return int(tail)


class TierStorageWriter(StorageWriter):
    """Writes one step of a DCP checkpoint into the node memory tier.

    On its own it gives only the memory tier: no peer copy, no S3, no retention (the tier fills up). So it
    refuses to run unless `tier_only=True` says that is what the caller wants, or a TieredCheckpointer
    drives it (`TieredCheckpointer.storage_writer(step)` gives one that carries all of that).
    """

    def __init__(
        self,
        tier: MemoryTier,
        step: int,
        *,
        world_size: int = 1,
        algo: str = DEFAULT_ALGO,
        tier_only: bool = False,
    ) -> None:
        super().__init__()
        self.tier_only = tier_only
        self.managed = False  # set by the TieredCheckpointer that owns this writer
        self.tier = tier
        self.step = step
        self.world_size = world_size
        self.algo = algo
        self.rank = 0
        self.is_coordinator = True
        self.save_id = uuid.uuid4().hex
        self._local_items: list[WriteItem] = []
        # Set by the caller (tests) to run between the data write and its rename: a crash point.
        self.fault_hook: Callable[[int], None] | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.step = step_from_id(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not (self.tier_only or self.managed):
            raise ValueError(
                "TierStorageWriter on its own writes only the memory tier: no peer copy, no S3 upload and "
                "no retention, so /dev/shm fills up. Use TieredCheckpointer.async_save(), a writer from "
                "TieredCheckpointer.storage_writer(step), or hpresilience.torch.hyperpod."
                "SageMakerTieredStorageWriter; pass tier_only=True if the memory tier alone is what you want."
            )
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        if rank is None and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
        self.rank = int(rank or 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self._local_items = list(plan.items)
        self.tier.ensure()
        self.tier.step_dir(self.step).mkdir(parents=True, exist_ok=True)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(p, storage_data=i) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        rank = plan.storage_data if isinstance(plan.storage_data, int) else self.rank
        primary = {it.index for it in plan.items}
        extras = [it for it in self._local_items if it.index not in primary]
        d = self.tier.step_dir(self.step)
        data_name, idx_name = shard_names(rank)
        tmp = d / f"{data_name}.tmp"
        spare = self.tier.spare(rank)
        try:
            os.replace(spare, tmp)  # reuse allocated tmpfs pages
        except FileNotFoundError:
            pass
        try:
            index, results = self._write_shard(tmp, rank, plan, planner, primary, extras)
            if self.fault_hook is not None:
                self.fault_hook(rank)
        except BaseException:
            # A failed write must not leave a shard-sized partial in tmpfs: give its pages back to
            # the spare slot (or drop them), so the next save does not run out of space because of it.
            try:
                self.tier.recycle(tmp, rank)
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            raise
        # The shard itself is streamed into a recycled spare (its tmpfs pages reused) and renamed here, so it
        # cannot go through fileio.atomic_write, which writes a whole buffer into a fresh file.
        os.replace(tmp, d / data_name)
        atomic_write(d / idx_name, index.to_json(), make_parents=False)
        fut_out: Future[list[WriteResult]] = Future()
        fut_out.set_result(results)
        return fut_out

    def _write_shard(
        self,
        tmp: Path,
        rank: int,
        plan: SavePlan,
        planner: SavePlanner,
        primary: set[MetadataIndex],
        extras: list[WriteItem],
    ) -> tuple[ShardIndex, list[WriteResult]]:
        index = ShardIndex(rank=rank, step=self.step, size=0)
        results: list[WriteResult] = []
        digest = hasher(self.algo)
        fd = open_private(tmp, os.O_WRONLY, reuse=True)
        # Hashing runs beside the write: both release the GIL, so two cores share the work.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-hash") as pool:
            try:
                offset = 0
                for item in list(plan.items) + extras:
                    buf, dtype, shape, keep_alive = self._item_bytes(item, planner)
                    fut = pool.submit(digest, buf)
                    _pwrite_all(fd, buf, offset)
                    loc = ItemLoc(
                        rank=rank,
                        offset=offset,
                        length=len(buf),
                        checksum=fut.result(),
                        algo=self.algo,
                        dtype=dtype,
                        shape=shape,
                    )
                    del keep_alive
                    index.items[_key(item.index)] = loc
                    if item.index in primary:
                        results.append(WriteResult(index=item.index, size_in_bytes=loc.length, storage_data=loc))
                    offset += loc.length
                os.ftruncate(fd, offset)
                index.size = offset
            finally:
                os.close(fd)
        return index, results

    @staticmethod
    def _item_bytes(
        item: WriteItem, planner: SavePlanner
    ) -> tuple[memoryview, str | None, tuple[int, ...] | None, object]:
        data = planner.resolve_data(item)
        if item.type == WriteItemType.BYTE_IO:
            raw = cast(io.BytesIO, data).getbuffer()
            return memoryview(raw).cast("B"), None, None, raw
        t = cast(torch.Tensor, data).detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        return tensor_bytes(t), str(t.dtype), tuple(t.shape), t

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {wr.index: wr.storage_data for rs in results for wr in rs}
        metadata.storage_meta = self.storage_meta()
        d = self.tier.step_dir(self.step)
        atomic_write(d / METADATA, pickle.dumps(metadata), make_parents=False)
        self.tier.write_commit(d, self.step, self.world_size, self.save_id)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=f"{SCHEME}{self.tier.base.name}/{self.step}", save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return str(checkpoint_id).startswith(SCHEME)


def _pwrite_all(fd: int, buf: memoryview, offset: int) -> None:
    done = 0
    while done < len(buf):
        done += os.pwrite(fd, buf[done:], offset + done)


def _pread_into(fd: int, buf: memoryview, offset: int, where: Path) -> None:
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n == 0:
            raise ChecksumError(f"{where}: truncated at byte {offset + done}")
        done += n
