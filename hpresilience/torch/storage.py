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
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from hpresilience.torch.layout import (
    DEFAULT_ALGO,
    METADATA,
    ChecksumError,
    ItemLoc,
    MemoryTier,
    ShardIndex,
    atomic_write,
    hasher,
    open_private,
    open_trusted,
    read_trusted,
    shard_names,
    step_name,
)

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
        os.replace(tmp, d / data_name)
        atomic_write(d / idx_name, index.to_json())
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
        atomic_write(d / METADATA, pickle.dumps(metadata))
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


class TierStorageReader(StorageReader):
    """Reads one committed step from the node memory tier.

    `shard_dirs` are searched in order for `rank_<k>.bin/.idx`; `fetch_missing(k)` may return a directory
    holding rank k's shard when none of them does (the checkpointer uses it for S3).
    """

    def __init__(
        self,
        step_dir: Path,
        *,
        rank: int = 0,
        shard_dirs: list[Path] | None = None,
        verify: bool = True,
        fetch_missing: Callable[[int], Path | None] | None = None,
    ) -> None:
        super().__init__()
        self.step_dir = Path(step_dir)
        self.rank = rank
        self.shard_dirs = [self.step_dir, *(shard_dirs or [])]
        self.verify = verify
        self.fetch_missing = fetch_missing
        self.storage_data: dict[MetadataIndex, ItemLoc] = {}
        self._indexes: dict[int, tuple[Path, ShardIndex] | None] = {}
        self._pending: list[tuple[Any, ItemLoc, Path, Any]] = []
        self._pool: Any = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        # DCP's contract: an id given here names the checkpoint to read (FileSystemReader honours it too).
        if checkpoint_id:
            text = str(checkpoint_id)
            if text.startswith(SCHEME):
                new_dir = self.step_dir.parent / step_name(step_from_id(text))
            else:
                new_dir = Path(checkpoint_id)
            self.shard_dirs = [new_dir, *(d for d in self.shard_dirs if d != self.step_dir)]
            self.step_dir = new_dir
        self.storage_data = {}
        self._indexes = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self.step_dir / METADATA
        # Only a file this user wrote, in a folder only this user can change, is ever unpickled.
        try:
            raw = read_trusted(path)
        except OSError as err:
            raise ChecksumError(f"{path}: unreadable checkpoint metadata ({err})") from None
        try:
            md = pickle.loads(raw)
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as err:
            raise ChecksumError(f"{path}: unreadable checkpoint metadata ({err})") from None
        if not isinstance(md, Metadata):
            raise ChecksumError(f"{path}: not DCP metadata")
        if md.storage_meta is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = uuid.uuid4().hex
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = cast(dict[MetadataIndex, ItemLoc], metadata.storage_data or {})
        rank = kwargs.get("rank")
        if rank is not None:
            self.rank = int(rank)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _shard(self, rank: int) -> tuple[Path, ShardIndex] | None:
        if rank not in self._indexes:
            found: tuple[Path, ShardIndex] | None = None
            dirs = list(self.shard_dirs)
            for d in dirs:
                data, idx = (d / n for n in shard_names(rank))
                if data.is_file() and idx.is_file():
                    found = (data, ShardIndex.from_json(read_trusted(idx), str(idx)))
                    break
            if found is None and self.fetch_missing is not None:
                d2 = self.fetch_missing(rank)
                if d2 is not None:
                    data, idx = (d2 / n for n in shard_names(rank))
                    found = (data, ShardIndex.from_json(read_trusted(idx), str(idx)))
            self._indexes[rank] = found
        return self._indexes[rank]

    def _locate(self, index: MetadataIndex) -> tuple[Path, ItemLoc]:
        own = self._shard(self.rank)
        if own is not None and _key(index) in own[1].items:
            return own[0], own[1].items[_key(index)]
        loc = self.storage_data.get(index)
        if loc is None:
            raise ChecksumError(f"checkpoint {self.step_dir} has no location for {index.fqn}")
        other = self._shard(loc.rank)
        if other is None:
            raise ChecksumError(
                f"{index.fqn} lives in rank {loc.rank}'s shard, which is neither on this node nor in S3"
            )
        return other[0], other[1].items.get(_key(index), loc)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        fds: dict[Path, int] = {}
        # Checksums of items read straight into their targets run in a second thread while the next
        # item is read (both release the GIL): verifying costs no extra pass over the bytes' time.
        self._pending = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-verify") as pool:
            self._pool = pool
            try:
                for req in plan.items:
                    path, loc = self._locate(req.storage_index)
                    if path not in fds:
                        fds[path] = open_trusted(path)
                    self._read_one(fds[path], path, loc, req, planner)
                for fut_hash, loc, path, req in self._pending:
                    self._compare(fut_hash.result(), loc, path, req)
            finally:
                for fd in fds.values():
                    os.close(fd)
                self._pending = []
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read_one(self, fd: int, path: Path, loc: ItemLoc, req: Any, planner: LoadPlanner) -> None:
        if req.type == LoadItemType.BYTE_IO:
            raw = bytearray(loc.length)
            _pread_into(fd, memoryview(raw), loc.offset, path)
            self._check(raw, loc, path, req)
            planner.load_bytes(req, io.BytesIO(raw))
            return
        assert loc.dtype is not None and loc.shape is not None
        target = planner.resolve_tensor(req).detach()
        whole = list(req.storage_offsets) == [0] * len(loc.shape) and tuple(req.lengths) == loc.shape
        same = target.device.type == "cpu" and target.is_contiguous() and str(target.dtype) == loc.dtype
        if whole and same:
            # Common case: the saved chunk is exactly the target; read straight into its memory.
            buf = tensor_bytes(target)
            _pread_into(fd, buf, loc.offset, path)
            if self.verify:
                # A mismatch fails the whole load once all items are read; the caller tries another source.
                self._pending.append((self._pool.submit(hasher(loc.algo), buf), loc, path, req))
        else:
            src = torch.empty(loc.shape, dtype=_dtype(loc.dtype))
            buf = tensor_bytes(src)
            _pread_into(fd, buf, loc.offset, path)
            self._check(buf, loc, path, req)
            for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
                src = src.narrow(dim, start, length)
            target.copy_(src)
        planner.commit_tensor(req, target)

    def _check(self, buf: Any, loc: ItemLoc, path: Path, req: Any) -> None:
        if self.verify:
            self._compare(hasher(loc.algo)(buf), loc, path, req)

    @staticmethod
    def _compare(digest: int, loc: ItemLoc, path: Path, req: Any) -> None:
        if digest != loc.checksum:
            raise ChecksumError(
                f"{path}: checksum mismatch in {req.storage_index.fqn} (bytes {loc.offset}.."
                f"{loc.offset + loc.length}); the shard is damaged"
            )

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return str(checkpoint_id).startswith(SCHEME)
