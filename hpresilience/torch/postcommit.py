"""The post-commit half of a tiered checkpoint: after DCP committed a step, the markers on every node, the
peer copy, the durable-tier upload and retention, in background threads, with failures recorded.

TieredCheckpointer owns one `PostCommit` and hands it jobs (`submit`); this module knows nothing of
saving or loading. Collectives here use the post-commit group (`repl`) and the upload group (`s3`), each
from one thread, in the same order on every rank.
"""

from __future__ import annotations

import pickle
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch
import torch.distributed as dist

from hpresilience.errors import HPResilienceError
from hpresilience.fileio import atomic_write
from hpresilience.log import get_logger
from hpresilience.torch.durable import DurableTier
from hpresilience.torch.jobs import (
    CheckpointStats,
    Committed,
    DirectSave,
    Failure,
    FailureLog,
    JobQueue,
    PostJob,
    Stage,
    Stop,
    Upload,
    UploadJob,
)
from hpresilience.torch.layout import COMMIT, METADATA, MemoryTier, shard_names
from hpresilience.torch.replica import exchange
from hpresilience.torch.settings import CheckpointConfig
from hpresilience.torch.staleness import stale_against

log = get_logger("hpresilience.torch")


class PostCommit:
    """The background work after each commit: one thread for markers, peer copy and retention, one for
    uploads (when there is a durable tier). `start()` them, `submit()` jobs, `settle()` to wait."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        tier: MemoryTier,
        durable: DurableTier | None,
        *,
        rank: int,
        world: int,
        distributed: bool,
        peer: int | None,
        source: int | None,
        repl_pg: Any,
        s3_pg: Any,
    ) -> None:
        self.cfg = cfg
        self.tier = tier
        self.durable = durable
        self.rank = rank
        self.world = world
        self.distributed = distributed
        self.peer = peer
        self.source = source
        self._repl_pg = repl_pg
        self._s3_pg = s3_pg
        self.stats = CheckpointStats()
        self.last_committed: int | None = None
        self._failed = FailureLog(self.stats)
        self._post_q: JobQueue[PostJob] = JobQueue()
        self._s3_q: JobQueue[UploadJob] = JobQueue()
        self._lock = threading.Lock()
        self._pinned: set[int] = set()  # steps kept from retention until their upload ends
        self._repl_ok = True
        self._threads = [threading.Thread(target=self._post_loop, name="ckpt-post", daemon=True)]
        if durable is not None:
            self._threads.append(threading.Thread(target=self._s3_loop, name="ckpt-s3", daemon=True))

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def submit(self, job: Committed | DirectSave) -> None:
        """Queue a saved step's post-commit work."""
        self._post_q.put(job)

    def settle(self, deadline: float) -> bool:
        """Wait (until the `time.monotonic()` deadline) for every queued job; True when all of them finished
        and nothing failed since the last call."""
        ok = True
        for q in (self._post_q, self._s3_q):
            if not q.join(max(0.0, deadline - time.monotonic())):
                log.error("checkpoint_flush_timed_out", rank=self.rank, pending=q.pending())
                ok = False
        if self._failed.take():
            ok = False
        return ok

    def stop(self, deadline: float) -> list[str]:
        """Stop the threads once their queues are done; the names of those still running at the deadline."""
        self._post_q.put(Stop())
        if self.durable is not None:
            self._s3_q.put(Stop())
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self._threads if t.is_alive()]

    @property
    def failures(self) -> list[Failure]:
        """Every save and post-commit failure, oldest first."""
        return list(self._failed.all)

    def fail(self, step: int, stage: Stage, err: BaseException | str) -> None:
        """Record and log a failure (a save's own, or a post-commit stage's); the next settle() is False."""
        text = str(err) or type(err).__name__ if isinstance(err, BaseException) else err
        self._failed.add(Failure(step=step, stage=stage, error=text, rank=self.rank))
        event = "checkpoint_save_failed" if stage is Stage.SAVE else "checkpoint_post_commit_failed"
        log.error(event, step=step, stage=stage.value, rank=self.rank, error=text)

    def _post_loop(self) -> None:
        while True:
            job = self._post_q.get()
            try:
                if isinstance(job, Stop):
                    return
                if isinstance(job, DirectSave):
                    self._settle_direct(job)
                else:
                    self._after_commit(job.step, job.metadata, job.to_s3)
            except Exception as err:  # noqa: BLE001 - a background failure must never kill training
                self.fail(-1 if isinstance(job, Stop) else job.step, Stage.MARKERS, err)
            finally:
                self._post_q.done()

    def _settle_direct(self, job: DirectSave) -> None:
        """Every rank, same order: did every rank write its shard, and did the coordinator commit?

        DCP gives no rank but the coordinator a callback after its commit, so the ranks agree here, on
        the post-commit group, and then run the same post-commit work as after async_save.
        """
        ok = self._agree(job.written)
        md = None
        if ok and self.rank == 0:
            # Every shard is written, so the coordinator's DCP thread goes on to finish() at once.
            try:
                md = job.metadata.result(self.cfg.timeout_s)
            except FutureTimeout:
                md = None
        if self.distributed:
            box: list[Any] = [md]
            dist.broadcast_object_list(box, src=0, group=self._repl_pg)
            md = box[0]
        if md is None:
            self.fail(job.step, Stage.SAVE, "not committed: a rank failed to write its shard")
            return
        self._after_commit(job.step, md, job.to_s3)

    def _agree(self, ok: bool) -> bool:
        """True on every rank iff `ok` on every rank (the post-commit group; same order everywhere)."""
        if not self.distributed:
            return ok
        flag = torch.tensor([1 if ok else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._repl_pg)
        return bool(flag.item())

    def _after_commit(self, step: int, md: Any, to_s3: bool | None = None) -> None:
        """Markers on this node, then (all ranks agreeing) the peer copy, retention and the upload queue.

        Every failure is recorded and the worker goes on; the collectives run on every rank in the same
        order whatever failed locally, so one rank's full tier cannot leave another waiting forever.
        """
        d = self.tier.step_dir(step)
        marked = True
        try:
            if not self.tier.is_committed(d):
                # Only the coordinator's node got COMMIT inside the save; the step is committed everywhere now.
                atomic_write(d / METADATA, pickle.dumps(md), make_parents=False)
                save_id = getattr(md.storage_meta, "save_id", "") or ""
                self.tier.write_commit(d, step, self.world, str(save_id))
        except OSError as err:
            marked = False
            self.fail(step, Stage.MARKERS, err)
        self.stats.committed += 1
        self.stats.last_committed_step = step
        log.info("checkpoint_committed", step=step, rank=self.rank)
        own = [s for s in self.tier.steps() if self.tier.has_shard(self.tier.step_dir(s), self.rank)]
        same_as = stale_against(step, own, self.tier.step_dir, self.rank)
        if same_as is not None:  # the step stays in the tier: a load refuses it (loading.py) and takes the one before
            self.fail(step, Stage.STALE, f"rank {self.rank}'s tensors at step {step} equal those of step {same_as}")
            log.error("checkpoint_stale_save", step=step, rank=self.rank, same_as=same_as)
        everywhere = self._agree(marked) if self.peer is not None and self._repl_ok else marked
        if self.peer is not None and self._repl_ok:
            if everywhere:
                self._replicate(step)
            else:
                self.fail(step, Stage.PEER_COPY, "skipped: a rank could not write this step's markers")
        due = self.durable is not None and (
            to_s3 if to_s3 is not None else self.cfg.s3_every > 0 and step % self.cfg.s3_every == 0
        )
        with self._lock:
            if due:
                self._pinned.add(step)
            pinned = set(self._pinned)
        try:
            self.tier.prune(self.rank, step, self.cfg.keep, pinned, peer_src=self.source)
        except OSError as err:
            self.fail(step, Stage.RETENTION, err)
        self.last_committed = step
        if due:
            self._s3_q.put(Upload(step))

    def _replicate(self, step: int) -> None:
        assert self.peer is not None and self.source is not None
        names = [*shard_names(self.rank), METADATA, COMMIT]
        src_names = [*shard_names(self.source), METADATA, COMMIT]
        d = self.tier.step_dir(step)
        into = self.tier.peer_dir(self.source, step)
        try:
            exchange(self._repl_pg, [d / n for n in names], self.peer, [into / n for n in src_names], self.source)
        except Exception as err:  # noqa: BLE001 - any failure here must stop replication, not training
            # A broken exchange leaves the group's message order unknown: stop using it rather than hang.
            self._repl_ok = False
            self.fail(step, Stage.PEER_COPY, err)
            log.error("peer_replica_disabled", step=step, peer=self.peer, error=str(err))
            return
        self.stats.peer_copies += 1
        log.info("peer_replica_written", step=step, to_rank=self.peer, held_for_rank=self.source)

    def _s3_loop(self) -> None:
        assert self.durable is not None
        while True:
            job = self._s3_q.get()
            try:
                if isinstance(job, Stop):
                    return
                self._upload(job.step)
            except Exception as err:  # noqa: BLE001 - a background failure must never kill training
                self.fail(-1 if isinstance(job, Stop) else job.step, Stage.UPLOAD, err)
            finally:
                if isinstance(job, Upload):
                    with self._lock:
                        self._pinned.discard(job.step)
                self._s3_q.done()

    def _upload(self, step: int) -> None:
        assert self.durable is not None
        d = self.tier.step_dir(step)
        ok = 1
        try:
            self.durable.upload_shard(d, step, self.rank)
        except (HPResilienceError, OSError) as err:
            ok = 0
            self.fail(step, Stage.UPLOAD, err)
        if self.distributed:
            flag = torch.tensor([ok])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._s3_pg)
            ok = int(flag.item())
        if not ok:
            if self.rank == 0:
                log.error("durable_step_not_committed", step=step, tier=self.durable.kind)
            return
        if self.rank == 0:
            self.durable.commit(d, step)
            log.info(
                "durable_checkpoint_committed", step=step, tier=self.durable.kind, marker=self.durable.marker(step)
            )
            if self.cfg.s3_keep:
                try:
                    self.durable.prune(self.cfg.s3_keep)
                except HPResilienceError as err:
                    self.fail(step, Stage.RETENTION, err)
        self.stats.uploads += 1
        self.stats.last_uploaded_step = step
