"""A DCP StorageWriter that carries the whole tiered checkpoint when handed to dcp.save/async_save.

`TieredCheckpointer.storage_writer(step)` returns one: the shape HyperPod's documentation uses
(`dcp.async_save(state, storage_writer=writer)`). Writing goes to the memory tier as usual; each rank
then hands a `DirectSave` job to the checkpointer's post-commit thread (through `submit`), which settles
the commit with the other ranks and runs the peer copy, the S3 upload and retention.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future as JobFuture
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from hpresilience.torch.jobs import DirectSave
from hpresilience.torch.layout import MemoryTier
from hpresilience.torch.storage import TierStorageWriter


class DirectWriter(TierStorageWriter):
    """Writes `step` into `tier` and hands the outcome to `submit` (the checkpointer's post-commit queue)."""

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

    def reset(self, checkpoint_id: Any = None) -> None:
        super().reset(checkpoint_id)
        self._metadata = JobFuture()

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        try:
            fut = super().write_data(plan, planner)
        except BaseException:
            self._submit(DirectSave(self.step, self.to_s3, written=False, metadata=self._metadata))
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
