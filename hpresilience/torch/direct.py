"""A DCP StorageWriter that carries the whole tiered checkpoint when handed to dcp.save/async_save.

`TieredCheckpointer.storage_writer(step)` returns one: the shape HyperPod's documentation uses
(`dcp.async_save(state, storage_writer=writer)`). Writing goes to the memory tier as usual; each rank
then hands a `DirectSave` job to the checkpointer's post-commit thread (through `submit`), which settles
the commit with the other ranks and runs the peer copy, the S3 upload and retention.

The time training waits on it goes to the goodput ledger (heartbeat.py): with `dcp.save`, DCP's whole call
in the thread that made the writer (its first call to the last); with `dcp.async_save`, the staging copy
in that call (the writer stages, as DCP's default would: a fresh CPU copy), not the write behind it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future as JobFuture
from typing import Any

from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from hpresilience.torch import heartbeat
from hpresilience.torch.jobs import DirectSave
from hpresilience.torch.layout import MemoryTier
from hpresilience.torch.storage import TierStorageWriter


class DirectWriter(TierStorageWriter, AsyncStager):
    """Writes `step` into `tier` and hands the outcome to `submit` (the checkpointer's post-commit queue)."""

    _synchronize_after_execute: bool = False  # stage() copies before it returns

    def __init__(
        self,
        tier: MemoryTier,
        step: int,
        *,
        world_size: int,
        to_s3: bool | None,
        submit: Callable[[DirectSave], None],
        fault_hook: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(tier, step, world_size=world_size)
        self.managed = True
        self.fault_hook = fault_hook
        self.to_s3 = to_s3
        self._submit = submit
        self._metadata: JobFuture[Any] = JobFuture()
        # The training thread (the writer is made there): DCP calls made in it block training; those of
        # dcp.async_save's worker thread do not.
        self._owner = threading.get_ident()
        self._began: float | None = None

    # -- the time training waits (the goodput ledger) ------------------------------------------------
    def _begin(self) -> None:
        if self._began is None and threading.get_ident() == self._owner:
            self._began = time.monotonic()

    def _end(self) -> None:
        began, self._began = self._began, None
        if began is not None:
            heartbeat.blocked("checkpoint", time.monotonic() - began)

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """dcp.async_save's copy of the state, in the caller's thread (DCP's default: a fresh CPU copy)."""
        with heartbeat.blocked_while("checkpoint"):
            staged: dict[str, Any] = _copy_state_dict(state_dict, _create_cpu_state_dict(state_dict), type_check=False)
            return staged

    def synchronize_staging(self) -> None:
        """Staging is finished when stage() returns."""

    def close(self) -> None:
        """Nothing to release: stage() keeps no buffer between saves."""

    # -- DCP's calls ---------------------------------------------------------------------------------
    def reset(self, checkpoint_id: Any = None) -> None:
        self._begin()
        super().reset(checkpoint_id)
        self._metadata = JobFuture()

    def storage_meta(self) -> StorageMeta | None:
        self._begin()  # dcp.save's first call when no checkpoint_id is given
        return super().storage_meta()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._begin()
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        try:
            fut = super().write_data(plan, planner)
        except BaseException:
            self._submit(DirectSave(self.step, self.to_s3, written=False, metadata=self._metadata))
            self._end()
            raise
        self._submit(DirectSave(self.step, self.to_s3, written=True, metadata=self._metadata))
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        committed: Metadata | None = None
        try:
            super().finish(metadata, results)
            committed = metadata
        finally:
            if not self._metadata.done():
                self._metadata.set_result(committed)
            self._end()
