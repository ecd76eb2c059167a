"""A staging buffer kept across async saves, so staging is one memcpy into warm memory.

DCP's default staging allocates a fresh CPU copy per save; on a fresh allocation every page faults in,
which costs several times the copy itself. We keep one copy per rank (the "cache_staged_state_dict" idea)
and rebuild it only when the state's layout changes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.staging import AsyncStager


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


class CachedStager(AsyncStager):
    """Blocking staging into a persistent CPU copy. One save at a time may use it (the checkpointer waits)."""

    _synchronize_after_execute: bool = False

    def __init__(self) -> None:
        self._cache: Any = None
        self._layout: Any = None

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        layout = layout_of(state_dict)
        if self._cache is None or layout != self._layout:
            self._cache = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
            self._layout = layout
        staged: dict[str, Any] = _copy_state_dict(state_dict, self._cache)
        return staged

    def synchronize_staging(self) -> None:
        """Staging is blocking: nothing to wait for."""

    def close(self) -> None:
        self._cache = None
        self._layout = None
