"""A staging buffer kept across async saves, so staging is one memcpy into warm memory.

DCP's default staging allocates a fresh CPU copy per save; on a fresh allocation every page faults in,
which costs several times the copy itself. We keep one copy per rank (the "cache_staged_state_dict" idea)
and rebuild it only when the state's layout changes.

The default copies everything inside `async_save`: what the checkpoint holds is the state at the call,
whatever the training loop writes afterwards and by whatever path.

Background staging (opt-in) moves the copy of large tensors off the training thread, as torchtitan's
"async_with_pinned_mem" mode does. The copy then runs until the next `forward` of any nn.Module or the
next `optimizer.step()` in the process, both of which wait for it (the checkpointer registers those
hooks), so it overlaps the data loading in between. Small tensors are copied inside the call. Writing a
saved tensor in that window by another path is not allowed; it is caught where it can be: an in-place op
bumps the tensor's version counter, and each tensor is compared with its copy once all are copied (a
write through `.data`, which bumps no counter, to a tensor already copied). Either fails that save with
TornStateError. A `.data` write to a tensor not yet copied cannot be seen.
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.staging import AsyncStager

from hpresilience.errors import HPResilienceError


def layout_of(obj: Any) -> Any:
    """Shapes, dtypes and keys of a nested state dict: two states stage into one buffer iff these match."""
    if isinstance(obj, torch.Tensor):
        return ("T", tuple(obj.shape), str(obj.dtype), obj.device.type)
    if isinstance(obj, dict):
        return tuple((str(k), layout_of(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return tuple(layout_of(v) for v in obj)
    return None


def local_bytes(obj: Any) -> int:
    """Bytes of tensor data this rank holds in a (possibly nested, possibly Stateful) state dict."""
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return int(local.numel() * local.element_size())
    if isinstance(obj, dict):
        return sum(local_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(local_bytes(v) for v in obj)
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        return local_bytes(obj.state_dict())
    return 0


Pair = tuple[torch.Tensor, torch.Tensor]


class TornStateError(HPResilienceError):
    """A tensor changed in place while the background staging copy was reading it."""


def _stage_tree(src: Any, dst: Any, deferred: list[Pair], inline_below: int) -> Any:
    """The staged view of `src` in the cache `dst`: tensors of `inline_below` bytes or more are only
    recorded in `deferred` (destination, source); everything else is copied now."""
    if isinstance(src, torch.Tensor):
        plain = type(src) in (torch.Tensor, torch.nn.Parameter) and type(dst) is torch.Tensor
        if not plain:  # DTensor, ShardedTensor: torch knows how to copy their local parts
            return _copy_state_dict({"t": src}, {"t": dst})["t"]
        if src.numel() * src.element_size() >= inline_below:
            deferred.append((dst, src))
        else:
            dst.copy_(src)
        return dst
    if isinstance(src, dict):
        return {k: _stage_tree(v, dst[k], deferred, inline_below) for k, v in src.items()}
    if isinstance(src, list):
        return [_stage_tree(a, b, deferred, inline_below) for a, b in zip(src, dst, strict=True)]
    if isinstance(src, tuple):
        return tuple(_stage_tree(a, b, deferred, inline_below) for a, b in zip(src, dst, strict=True))
    # Any other leaf (a number, a dataclass, a set) is copied now: the caller may change it after we return.
    return copy.deepcopy(src)


class CachedStager(AsyncStager):
    """Staging into a persistent CPU copy. One save at a time may use it (the checkpointer waits).

    With `background=True`, `stage()` copies tensors under `inline_below` bytes at once and returns a
    future that a worker thread completes once the large ones are copied; `wait()` blocks until then.
    """

    _synchronize_after_execute: bool = False

    def __init__(self, *, background: bool = False, inline_below: int = 1 << 20) -> None:
        self.background = background
        self.inline_below = inline_below
        self._cache: Any = None
        self._layout: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[Any] | None = None

    def _cache_for(self, state_dict: dict[str, Any]) -> Any:
        layout = layout_of(state_dict)
        if self._cache is None or layout != self._layout:
            self._cache = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
            self._layout = layout
        return self._cache

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any] | Future[dict[str, Any]]:
        self.wait()
        cache = self._cache_for(state_dict)
        if not self.background:
            # type_check=False: DCP's own save accepts any picklable leaf (a dataclass, a set), so must we.
            staged: dict[str, Any] = _copy_state_dict(state_dict, cache, type_check=False)
            return staged
        deferred: list[Pair] = []
        with torch.no_grad():
            view: dict[str, Any] = _stage_tree(state_dict, cache, deferred, self.inline_below)
        if not deferred:
            return view
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-stage")
        # The guard: every in-place change bumps a tensor's version counter (shared with its detached
        # views, which is what state_dict() returns), and each copy is compared with its source at the
        # end. A change between the call and the end of the copy would mix two states, so that save
        # fails instead of storing it.
        versions = [src._version for _, src in deferred]
        self._pending = self._pool.submit(self._copy_checked, deferred, versions, view)
        return self._pending

    def _copy_checked(self, pairs: list[Pair], versions: list[int], view: dict[str, Any]) -> dict[str, Any]:
        out = self._copy(pairs, view)
        changed = [src for (_, src), v in zip(pairs, versions, strict=True) if src._version != v]
        if not changed:
            # `.data` writes bump no counter: a source that no longer equals its copy changed after it.
            changed = [src for dst, src in pairs if not _same(dst, src)]
        if changed:
            t = changed[0]
            raise TornStateError(
                f"{len(changed)} saved tensor(s) (the first: shape {tuple(t.shape)}, {t.dtype}) changed in "
                "place while async_save was still copying them in the background; the checkpoint would mix "
                "two training states, so this save is dropped. With background_staging, call "
                "ckpt.wait_staged() before changing saved tensors other than through a module's forward or "
                "optimizer.step(), or leave background_staging off (the default)."
            )
        return out

    def _copy(self, pairs: list[Pair], view: dict[str, Any]) -> dict[str, Any]:
        # Grad mode is per thread: this one starts with it on.
        with torch.no_grad():
            for dst, src in pairs:
                self._copy_one(dst, src)
        return view

    @staticmethod
    def _copy_one(dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def pending(self) -> bool:
        fut = self._pending
        return fut is not None and not fut.done()

    def wait(self, timeout: float | None = None) -> float:
        """Block until a background copy has finished, at most `timeout` seconds (None: until it ends); the
        seconds waited (0.0 when none was running).

        Never raises: a failed copy fails its save, which the checkpointer logs.
        """
        fut = self._pending  # one reference read: the optimizer hook may run in another thread
        if fut is None or fut.done():
            return 0.0
        t0 = time.monotonic()
        try:
            fut.result(timeout)
        except Exception:  # noqa: BLE001 - reported through the save's own future; a timeout leaves it running
            pass
        return time.monotonic() - t0

    def synchronize_staging(self) -> None:
        """Inline staging is finished when stage() returns; background staging reports through its future."""

    def close(self, timeout: float | None = None) -> None:
        """Stop the copy thread, waiting at most `timeout` seconds for a copy in progress (None: until it
        ends); one still running then finishes in its thread, unwaited here."""
        self.wait(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=not self.pending())
            self._pool = None
        self._cache = None
        self._layout = None


# A host copy is compared with its GPU source a slice at a time on the GPU: bounded extra device memory, and
# the bytes cross the bus once more only in the background thread. (torch.equal refuses two devices.)
_COMPARE_CHUNK_BYTES = 64 << 20


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The same memory as integers of the element's width: compared bit for bit, a NaN equals itself
    (torch.equal(nan, nan) is False, so a tensor holding a NaN read as changed and every save failed)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    width = _INT_OF_WIDTH.get(t.element_size())
    return t if width is None or t.dtype == width else t.view(width)


_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(_bits(a), _bits(b)))


def _same(dst: torch.Tensor, src: torch.Tensor) -> bool:
    if dst.shape != src.shape or dst.dtype != src.dtype:
        return False
    if dst.device == src.device:
        return _equal(dst, src)
    if not (dst.is_contiguous() and src.is_contiguous()):
        return _equal(dst.to(src.device), src)
    a, b = dst.reshape(-1), src.reshape(-1)
    step = max(1, _COMPARE_CHUNK_BYTES // max(1, src.element_size()))
    return all(_equal(a[i : i + step].to(src.device), b[i : i + step]) for i in range(0, a.numel(), step))
