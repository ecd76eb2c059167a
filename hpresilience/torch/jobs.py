"""The checkpointer's background work: typed jobs, a queue that can be waited on with a deadline, and
the record of what failed after a commit (pure Python: no torch here).

A post-commit failure (markers, peer copy, upload, retention) never stops training and never stops the
worker: it is logged, counted in `CheckpointStats` and kept in the failure list, and the next `flush()`
returns False. Waiting is always bounded: a job stuck in a collective whose peer died ends with that
group's timeout, and `flush()`/`close()` give up at their own deadline.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar


class Stage(Enum):
    """Where a save or its follow-up work failed."""

    SAVE = "save"
    MARKERS = "markers"
    PEER_COPY = "peer_copy"
    UPLOAD = "upload"
    RETENTION = "retention"
    STALE = "stale"  # the save holds the previous save's tensors (staleness.py): loads refuse it


@dataclass(frozen=True)
class Committed:
    """A step DCP committed through save()/async_save(): run the post-commit work for it."""

    step: int
    metadata: Any
    to_s3: bool | None = None


@dataclass(frozen=True)
class DirectSave:
    """A step written through a DirectWriter (dcp.save with `storage_writer=`): the ranks agree whether
    every shard was written and the coordinator committed, then the post-commit work runs as for Committed.

    `metadata` resolves on the coordinator only (DCP calls no other rank after its commit): to the step's
    metadata once committed, to None when the commit failed."""

    step: int
    to_s3: bool | None
    written: bool
    metadata: Future[Any]


@dataclass(frozen=True)
class Upload:
    """A committed step due for the durable tier."""

    step: int


@dataclass(frozen=True)
class Stop:
    """Ends a worker once everything queued before it is done."""


# What the post-commit thread and the upload thread are given.
PostJob = Committed | DirectSave | Stop
UploadJob = Upload | Stop


@dataclass(frozen=True)
class Failure:
    step: int
    stage: Stage
    error: str
    rank: int
    time: float = field(default_factory=time.time)


@dataclass
class CheckpointStats:
    """Counters a trainer can export as metrics (e.g. next to its own step counters)."""

    committed: int = 0
    save_failures: int = 0
    peer_copies: int = 0
    uploads: int = 0
    post_commit_failures: int = 0
    last_committed_step: int | None = None
    last_uploaded_step: int | None = None


J = TypeVar("J")


class JobQueue(Generic[J]):
    """FIFO of jobs with `join(timeout)`: True when every job put so far has been processed."""

    def __init__(self) -> None:
        self._items: deque[J] = deque()
        self._cond = threading.Condition()
        self._unfinished = 0

    def put(self, job: J) -> None:
        with self._cond:
            self._items.append(job)
            self._unfinished += 1
            self._cond.notify_all()

    def get(self) -> J:
        with self._cond:
            while not self._items:
                self._cond.wait()
            return self._items.popleft()

    def done(self) -> None:
        with self._cond:
            self._unfinished -= 1
            self._cond.notify_all()

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._unfinished:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def pending(self) -> int:
        with self._cond:
            return self._unfinished


class FailureLog:
    """Failures since the last `take()`, plus the full count in the stats."""

    def __init__(self, stats: CheckpointStats) -> None:
        self.stats = stats
        self._lock = threading.Lock()
        self._new: list[Failure] = []
        self.all: list[Failure] = []

    def add(self, failure: Failure) -> None:
        with self._lock:
            self._new.append(failure)
            self.all.append(failure)
            if failure.stage is Stage.SAVE:
                self.stats.save_failures += 1
            else:
                self.stats.post_commit_failures += 1

    def take(self) -> list[Failure]:
        with self._lock:
            out, self._new = self._new, []
            return out
