"""TieredCheckpointer: memory tier in the save call, peer copy and durable tier behind it (postcommit.py),
tiered restore (loading.py).

Threads and groups. Each kind of collective has its own gloo group, used by exactly one thread at a time
and in the same order on every rank: DCP's save/load (`save` group, the DCP worker or the main thread),
the peer copy (`repl` group, the post-commit thread) and S3 commits (`s3` group, the upload thread).
Nothing shares the trainer's NCCL/default group, so a slow copy can neither deadlock nor time out training.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from hpresilience.errors import ConfigError
from hpresilience.log import get_logger
from hpresilience.torch import heartbeat
from hpresilience.torch.direct import DirectSave, DirectWriter
from hpresilience.torch.durable import durable_tier
from hpresilience.torch.jobs import (
    CheckpointStats,
    Committed,
    FailureLog,
    JobQueue,
    Stage,
    Stop,
    Upload,
)
from hpresilience.torch.layout import (
    ChecksumError,
    MemoryTier,
    shard_names,
)
from hpresilience.torch.loading import LoadMixin
from hpresilience.torch.postcommit import PostCommitMixin
from hpresilience.torch.replica import peer_of, source_of
from hpresilience.torch.restore import Source
from hpresilience.torch.settings import CheckpointConfig
from hpresilience.torch.staging import CachedStager, local_bytes
from hpresilience.torch.storage import TierStorageWriter

log = get_logger("hpresilience.torch")


class TieredCheckpointer(PostCommitMixin, LoadMixin):
    """Save and restore one job's training state through the memory, peer and S3 tiers."""

    def __init__(self, cfg: CheckpointConfig, *, s3_client: Any = None) -> None:
        self.cfg = cfg
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        if cfg.world_size is not None and cfg.world_size != self.world:
            raise ConfigError(
                f"checkpoint world_size is {cfg.world_size} but the process group has {self.world}"
            )
        self.local_ranks = min(cfg.local_ranks(), self.world)
        self.tier = MemoryTier(cfg.memory_dir, cfg.namespace)
        self.peer = peer_of(self.rank, self.world, self.local_ranks) if cfg.replicate else None
        self.source = source_of(self.rank, self.world, self.local_ranks) if cfg.replicate else None
        if cfg.replicate and self.peer is None and self.rank == 0:
            log.warning("peer_replica_unavailable", reason="all ranks are on one node", world_size=self.world)
        shard = int(cfg.shard_gib * (1 << 30)) if cfg.shard_gib else 0
        self.tier.check_capacity(shard, cfg.keep, self.local_ranks, 1 if self.peer is not None else 0)
        # S3 or a shared filesystem; the same upload, restore and fallback paths serve both.
        self.durable = durable_tier(cfg, s3_client)
        timeout = timedelta(seconds=cfg.timeout_s)
        # Every rank creates the same groups in the same order (new_group is itself collective).
        self._save_pg = dist.new_group(backend="gloo", timeout=timeout) if self.distributed else None
        self._repl_pg = dist.new_group(backend="gloo", timeout=timeout) if self.distributed else None
        self._s3_pg = (
            dist.new_group(backend="gloo", timeout=timeout) if self.distributed and self.durable else None
        )
        self._stager = CachedStager(
            background=cfg.background_staging, inline_below=int(cfg.inline_staging_below_mib * (1 << 20))
        )
        # The optimizer step and a module's forward (BatchNorm statistics, in-forward updates) are what
        # change the state a background copy is still reading: both wait for it.
        self._step_hook = (
            register_optimizer_step_pre_hook(self._before_optimizer_step) if cfg.background_staging else None
        )
        self._forward_hook = (
            register_module_forward_pre_hook(self._before_forward) if cfg.background_staging else None
        )
        self._inflight: Future[Any] | None = None
        self._inflight_posted = threading.Event()
        self._capacity_checked = shard > 0
        self._pinned: set[int] = set()
        self._lock = threading.Lock()
        self._repl_ok = True
        self.last_committed: int | None = None
        # Where the last load took this rank's shard from: "own", "peer" or "s3".
        self.last_source: str | None = None
        self._last_sources: list[Source] = []
        self.last_skipped: list[str] = []
        # Tests set this to crash a rank between writing its shard and renaming it into place.
        self.fault_hook: Any = None
        self.stats = CheckpointStats()
        self._failed = FailureLog(self.stats)
        self._post_q: JobQueue[Committed | DirectSave | Stop] = JobQueue()
        self._s3_q: JobQueue[Upload | Stop] = JobQueue()
        self._threads = [threading.Thread(target=self._post_loop, name="ckpt-post", daemon=True)]
        if self.durable is not None:
            self._threads.append(threading.Thread(target=self._s3_loop, name="ckpt-s3", daemon=True))
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ saving
    def _writer(self, step: int) -> TierStorageWriter:
        w = TierStorageWriter(self.tier, step, world_size=self.world)
        w.managed = True
        w.fault_hook = self.fault_hook
        return w

    def _check_capacity_once(self, state_dict: Any) -> None:
        if self._capacity_checked:
            return
        self.tier.check_capacity(
            local_bytes(state_dict), self.cfg.keep, self.local_ranks, 1 if self.peer is not None else 0
        )
        self._capacity_checked = True

    def _check_to_s3(self, to_s3: bool | None) -> None:
        if to_s3 and self.durable is None:
            raise ConfigError("to_s3=True, but the checkpoint has no durable tier (set s3_base or fs_base)")

    @heartbeat.blocking("checkpoint")  # the goodput ledger's `checkpoint`: training waits this long
    def save(self, state_dict: dict[str, Any], step: int, *, to_s3: bool | None = None) -> None:
        """Blocking save of `step` to the memory tier; peer copy and S3 follow in the background.

        `to_s3` overrides `s3_every` for this step (True: upload it, e.g. the last save before a
        preemption; False: don't).
        """
        self._check_to_s3(to_s3)
        heartbeat.beat(step)  # a save is progress: the wrapper's hang clock and stragglers see it
        self.wait()
        self._check_capacity_once(state_dict)
        md = dcp_save(state_dict, storage_writer=self._writer(step), process_group=self._save_pg)
        self._post_q.put(Committed(step, md, to_s3))

    @heartbeat.blocking("checkpoint")  # the goodput ledger's `checkpoint`: training waits this long
    def async_save(self, state_dict: dict[str, Any], step: int, *, to_s3: bool | None = None) -> Future[Any]:
        """Stage `state_dict` (one memcpy; in the background when `background_staging`) and write it
        in the background. `to_s3` as for save().

        Returns DCP's future (its result is the checkpoint metadata). At most one save is in flight:
        a second call first waits for the previous one.
        """
        self._check_to_s3(to_s3)
        heartbeat.beat(step)  # a save is progress: the wrapper's hang clock and stragglers see it
        self.wait()
        self._check_capacity_once(state_dict)
        resp = dcp_async_save(
            state_dict,
            storage_writer=self._writer(step),
            process_group=self._save_pg,
            async_stager=self._stager,
        )
        fut: Future[Any] = resp if isinstance(resp, Future) else resp.upload_completion

        posted = threading.Event()

        def done(f: Future[Any], step: int = step) -> None:
            try:
                if f.exception() is not None:
                    self._fail(step, Stage.SAVE, f.exception() or "failed")
                else:
                    self._post_q.put(Committed(step, f.result(), to_s3))
            finally:
                posted.set()

        fut.add_done_callback(done)
        self._inflight = fut
        self._inflight_posted = posted
        return fut

    def wait_staged(self) -> float:
        """Block until the state passed to the last async_save is copied; the seconds waited.

        Needed only with `background_staging`, before changing saved tensors other than through a
        module's forward or optimizer.step() (which wait by themselves).
        """
        return self._stager.wait()

    def _before_forward(self, module: Any, args: Any) -> None:
        if self._stager.pending():
            waited = self._stager.wait()
            log.info("checkpoint_staging_waited", seconds=round(waited, 4), rank=self.rank, before="forward")

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        waited = self._stager.wait()
        if waited > 0:
            log.info("checkpoint_staging_waited", seconds=round(waited, 4), rank=self.rank)

    def wait(self) -> bool:
        """Wait for the in-flight save (not its peer copy or upload); False if it failed."""
        fut, self._inflight = self._inflight, None
        if fut is None:
            return True
        ok = True
        try:
            fut.result()
        # CheckpointException derives from BaseException in torch 2.13: catch it by name, or a failed
        # background save would surface from whichever save/load/close comes next.
        except (Exception, CheckpointException):  # noqa: BLE001 - logged by the done callback
            ok = False
        # A future's waiters wake before its callbacks run: wait until the step's post-commit job is
        # queued, or a flush() right after could miss it.
        self._inflight_posted.wait(self.cfg.timeout_s)
        return ok

    def storage_writer(self, step: int, *, to_s3: bool | None = None) -> DirectWriter:
        """A writer for `dcp.save`/`dcp.async_save(storage_writer=...)` that carries the whole tiered
        behaviour: memory tier, then (in this checkpointer's background thread) commit markers on every
        node, the peer copy, the durable tier where due (or as `to_s3` says) and retention. Call it on
        every rank."""
        self._check_to_s3(to_s3)
        return DirectWriter(self, step, to_s3)

    # ------------------------------------------------------------------ loading
    def _gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self._save_pg)
        return out

    @heartbeat.blocking("restore")  # the goodput ledger's `restore`
    def load(self, state_dict: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest step every rank can get (or `step`) into `state_dict`; None if there is none.

        Each rank takes its shard from its own memory tier, else from the rank holding its peer copy,
        else from S3. A shard that fails its checksums is skipped and the next source tried. A step
        saved with another world size is resharded: each rank gathers the saved shards from the nodes
        holding them, else from S3.
        """
        bad: set[tuple[int, Source, int]] = set()
        bad_steps: set[int] = set()
        self.last_skipped = []
        while True:
            prepared = self.prepare_load(step, bad, state_dict=state_dict, bad_steps=bad_steps)
            if prepared is None:
                return None
            chosen, reader = prepared
            try:
                dcp_load(state_dict, storage_reader=reader, process_group=self._save_pg)
            except CheckpointException as err:
                # Checksums are verified during the read; a damaged shard fails the load on every rank
                # alike (DCP gathers the failures), and every rank then tries the next source.
                damaged = sorted(r for r, (exc, _) in err.failures.items() if isinstance(exc, ChecksumError))
                if not damaged:
                    raise
                if not self._last_sources:  # a resharding load: a gathered shard is damaged, skip the step
                    bad_steps.add(chosen)
                    self.last_skipped += [
                        f"step {chosen} (resharded), read by rank {r}: {err.failures[r][0]}" for r in damaged
                    ]
                    log.warning("checkpoint_step_skipped", step=chosen, errors=self.last_skipped[-len(damaged):])
                    continue
                if self.rank in damaged:
                    # Whatever its source, the shard was read from this rank's step folder: drop it, or
                    # the next attempt would take it for an own copy and fail on it again.
                    for name in shard_names(self.rank):
                        (self.tier.step_dir(chosen) / name).unlink(missing_ok=True)
                for r in damaged:
                    bad.add((r, self._last_sources[r], chosen))
                    self.last_skipped.append(
                        f"step {chosen}, rank {r} from {self._name(self._last_sources[r])}: {err.failures[r][0]}"
                    )
                    log.warning(
                        "checkpoint_shard_skipped", step=chosen, rank=r, error=str(err.failures[r][0])
                    )
                continue
            finally:
                self.finish_load(chosen)
            return chosen

    # ------------------------------------------------------------------ lifecycle
    def close(self, *, keep_tier: bool = False, timeout: float | None = None) -> bool:
        """Finish pending copies and uploads (within `timeout`, default `timeout_s`), stop the background
        threads and, unless `keep_tier`, remove this job's memory tier on every node (collective).

        Keep the tier (`keep_tier=True`) when the job goes on elsewhere in this allocation: a preemption
        exit that auto-resume relaunches. A job that crashes never gets here; the Slurm epilog that
        `hpresilience install --role compute` sets up removes its tier. True when everything finished.
        """
        deadline = time.monotonic() + (self.cfg.timeout_s if timeout is None else timeout)
        ok = self.flush(timeout=max(0.0, deadline - time.monotonic()))
        self._post_q.put(Stop())
        if self.durable is not None:
            self._s3_q.put(Stop())
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        for hook in (self._step_hook, self._forward_hook):
            if hook is not None:
                hook.remove()
        self._step_hook = self._forward_hook = None
        self._stager.close()
        if stuck:
            # A thread still inside a collective would use a destroyed group: leave the groups (and the
            # daemon threads) to the process's exit.
            log.error("checkpoint_close_timed_out", rank=self.rank, threads=stuck)
            return False
        if not keep_tier:
            ok = self._remove_tier(max(1.0, deadline - time.monotonic())) and ok
        for pg in (self._save_pg, self._repl_pg, self._s3_pg):
            if pg is not None:
                dist.destroy_process_group(pg)
        self._save_pg = self._repl_pg = self._s3_pg = None
        return ok

    def _remove_tier(self, timeout: float) -> bool:
        """Every rank has flushed; then one rank per node removes the node's folder of this job. A rank
        that does not come (it kept its tier, or died) leaves the tier to the epilog after `timeout`."""
        if self.distributed:
            try:
                dist.monitored_barrier(group=self._save_pg, timeout=timedelta(seconds=timeout))
            except Exception as err:  # noqa: BLE001 - a missing rank: leave the tier to the epilog
                log.error("checkpoint_tier_kept", rank=self.rank, reason=str(err))
                return False
        if self.rank % self.local_ranks == 0:
            removed = self.tier.remove()
            log.info("checkpoint_tier_removed", rank=self.rank, folder=str(self.tier.base), bytes=removed)
        return True

    def __enter__(self) -> TieredCheckpointer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # An exception keeps the tier: the relaunched step may restore from it.
        self.close(keep_tier=exc_type is not None)
