"""A DCP StorageWriter that carries the whole tiered checkpoint when handed to dcp.save/async_save.

`TieredCheckpointer.storage_writer(step)` returns one: the shape HyperPod's documentation uses
(`dcp.async_save(state, storage_writer=writer)`). Writing goes to the memory tier as usual; each rank
then queues a `DirectSave` for the checkpointer's post-commit thread, which settles the commit with the
other ranks and runs the peer copy, the S3 upload and retention.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from hpresilience.torch.storage import TierStorageWriter

if TYPE_CHECKING:
    from hpresilience.torch.checkpointer import TieredCheckpointer


@dataclass
class DirectSave:
    """One rank's view of a save made through dcp with a DirectWriter."""

    step: int
    to_s3: bool | None
    written: bool = False
    metadata: Metadata | None = None
    finished: threading.Event = field(default_factory=threading.Event)


class DirectWriter(TierStorageWriter):
    def __init__(self, ck: TieredCheckpointer, step: int, to_s3: bool | None) -> None:
        super().__init__(ck.tier, step, world_size=ck.world)
        self.managed = True
        self.ck = ck
        self.fault_hook = ck.fault_hook
        self.job = DirectSave(step=step, to_s3=to_s3)

    def reset(self, checkpoint_id: Any = None) -> None:
        super().reset(checkpoint_id)
        self.job = DirectSave(step=self.step, to_s3=self.job.to_s3)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        try:
            fut = super().write_data(plan, planner)
        except BaseException:
            self.job.written = False
            self.ck.submit(self.job)
            raise
        self.job.written = True
        self.ck.submit(self.job)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        try:
            super().finish(metadata, results)
            self.job.metadata = metadata
        finally:
            self.job.finished.set()
