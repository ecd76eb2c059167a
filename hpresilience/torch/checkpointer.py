"""TieredCheckpointer: memory tier in the save call; peer copy and durable tier behind it (a PostCommit,
postcommit.py); tiered restore (a Loader, loading.py). Both parts are given what they need at creation and
know nothing of this class.

Threads and groups. Each kind of collective has its own gloo group, used by exactly one thread at a time
and in the same order on every rank: DCP's save/load (`save` group, the DCP worker or the main thread),
the peer copy (`repl` group, the post-commit thread) and S3 commits (`s3` group, the upload thread).
Nothing shares the trainer's NCCL/default group, so a slow copy can neither deadlock nor time out training.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from hpresilience.errors import ConfigError
from hpresilience.log import get_logger
from hpresilience.torch import heartbeat
from hpresilience.torch.direct import DirectWriter
from hpresilience.torch.durable import durable_tier
from hpresilience.torch.jobs import CheckpointStats, Committed, DirectSave, Failure, Stage
from hpresilience.torch.layout import MemoryTier
from hpresilience.torch.loading import Loader
from hpresilience.torch.postcommit import PostCommit
from hpresilience.torch.reader import TierStorageReader
from hpresilience.torch.replica import peer_of, source_of
from hpresilience.torch.settings import CheckpointConfig
from hpresilience.torch.staging import CachedStager, local_bytes
from hpresilience.torch.storage import TierStorageWriter

log = get_logger("hpresilience.torch")


class TieredCheckpointer:
    """Save and restore one job's training state through the memory, peer and S3 tiers."""

    def __init__(self, cfg: CheckpointConfig, *, s3_client: Any = None) -> None:
        self.cfg = cfg
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        if cfg.world_size is not None and cfg.world_size != self.world:
            raise ConfigError(f"checkpoint world_size is {cfg.world_size} but the process group has {self.world}")
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
        self._s3_pg = dist.new_group(backend="gloo", timeout=timeout) if self.distributed and self.durable else None
        self._stager = CachedStager(
            background=cfg.background_staging, inline_below=int(cfg.inline_staging_below_mib * (1 << 20))
        )
        # The optimizer step and a module's forward (BatchNorm statistics, in-forward updates) are what
        # change the state a background copy is still reading: both wait for it.
        self._step_hook = (
            register_optimizer_step_pre_hook(self._before_optimizer_step) if cfg.background_staging else None
        )
        self._forward_hook = register_module_forward_pre_hook(self._before_forward) if cfg.background_staging else None
        self._inflight: Future[Any] | None = None
        self._inflight_posted = threading.Event()
        self._capacity_checked = shard > 0
        # Tests set this to crash a rank between writing its shard and renaming it into place.
        self.fault_hook: Any = None
        self._post = PostCommit(
            cfg,
            self.tier,
            self.durable,
            rank=self.rank,
            world=self.world,
            distributed=self.distributed,
            peer=self.peer,
            source=self.source,
            repl_pg=self._repl_pg,
            s3_pg=self._s3_pg,
        )
        self._loader = Loader(
            cfg,
            self.tier,
            self.durable,
            rank=self.rank,
            world=self.world,
            distributed=self.distributed,
            save_pg=self._save_pg,
            repl_pg=self._repl_pg,
            flush=self.flush,
            prepared=self._set_last_committed,
        )
        self.stats: CheckpointStats = self._post.stats
        self._post.start()

    # ------------------------------------------------------------------ state of the parts
    @property
    def last_committed(self) -> int | None:
        """The newest step this checkpointer committed or prepared to load."""
        return self._post.last_committed

    def _set_last_committed(self, step: int) -> None:
        self._post.last_committed = step

    @property
    def last_source(self) -> str | None:
        """Where the last load took this rank's shard from: "own", "peer", "s3"/"filesystem" or "resharded"."""
        return self._loader.last_source

    @property
    def last_skipped(self) -> list[str]:
        """Why the last load passed over newer or nearer sources: "step N, rank R from SOURCE: reason"."""
        return self._loader.last_skipped

    @property
    def last_behind(self) -> int | None:
        """The newest committed step the last load saw when it restored an older one (staleness.py), else None."""
        return self._loader.last_behind

    @property
    def failures(self) -> list[Failure]:
        """Every save and post-commit failure of this checkpointer, oldest first."""
        return self._post.failures

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
        self._post.submit(Committed(step, md, to_s3))

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
                    self._post.fail(step, Stage.SAVE, f.exception() or "failed")
                else:
                    self._post.submit(Committed(step, f.result(), to_s3))
            finally:
                posted.set()

        fut.add_done_callback(done)
        self._inflight = fut
        self._inflight_posted = posted
        return fut

    @heartbeat.blocking("checkpoint")
    def wait_staged(self) -> float:
        """Block until the state passed to the last async_save is copied; the seconds waited.

        Needed only with `background_staging`, before changing saved tensors other than through a
        module's forward or optimizer.step() (which wait by themselves).
        """
        return self._stager.wait()

    def _before_forward(self, module: Any, args: Any) -> None:
        if self._stager.pending():
            waited = self._stager.wait()
            heartbeat.blocked("checkpoint", waited)  # the goodput ledger's: the forward waited for the copy
            log.info("checkpoint_staging_waited", seconds=round(waited, 4), rank=self.rank, before="forward")

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        waited = self._stager.wait()
        if waited > 0:
            heartbeat.blocked("checkpoint", waited)
            log.info("checkpoint_staging_waited", seconds=round(waited, 4), rank=self.rank)

    @heartbeat.blocking("checkpoint")
    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the in-flight save (not its peer copy or upload), at most `timeout` seconds (None: until it
        ends); False if it failed or is still running (then it stays in flight: a later wait waits again)."""
        fut = self._inflight
        if fut is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = True
        try:
            fut.result(timeout)
        except FutureTimeout:
            # A flush/close with a timeout returns on time: a preemption exit must not wait for the save's
            # gloo collective (timeout_s, 600 s by default) because a peer is gone.
            log.error("checkpoint_save_still_running", rank=self.rank, waited_s=timeout)
            return False
        # CheckpointException derives from BaseException in torch 2.13: catch it by name, or a failed
        # background save would surface from whichever save/load/close comes next.
        except (Exception, CheckpointException):  # noqa: BLE001 - logged by the done callback
            ok = False
        self._inflight = None
        # A future's waiters wake before its callbacks run: wait until the step's post-commit job is
        # queued, or a flush() right after could miss it.
        left = self.cfg.timeout_s if deadline is None else max(0.05, deadline - time.monotonic())
        return self._inflight_posted.wait(left) and ok

    def storage_writer(self, step: int, *, to_s3: bool | None = None) -> DirectWriter:
        """A writer for `dcp.save`/`dcp.async_save(storage_writer=...)` that carries the whole tiered
        behaviour: memory tier, then (in this checkpointer's background thread) commit markers on every
        node, the peer copy, the durable tier where due (or as `to_s3` says) and retention. Call it on
        every rank."""
        self._check_to_s3(to_s3)
        return DirectWriter(
            self.tier, step, world_size=self.world, to_s3=to_s3, submit=self.submit, fault_hook=self.fault_hook
        )

    def submit(self, job: Committed | DirectSave) -> None:
        """Queue a saved step's post-commit work (for DirectWriter; save()/async_save() do it themselves)."""
        self._post.submit(job)

    @heartbeat.blocking("checkpoint")  # a preemption exit's or a HyperPod script's wait for the copies
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every committed step is copied to its peer and uploaded where due, at most
        `timeout` seconds (default `timeout_s`). True when all of it finished and nothing failed since
        the last flush; the failures themselves are in `failures` and counted in `stats`."""
        deadline = time.monotonic() + (self.cfg.timeout_s if timeout is None else timeout)
        ok = self.wait(max(0.0, deadline - time.monotonic()))
        return self._post.settle(deadline) and ok

    # ------------------------------------------------------------------ loading
    @heartbeat.blocking("restore")  # the goodput ledger's `restore`
    def load(self, state_dict: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest step every rank can get (or `step`) into `state_dict`; None if there is none.

        Each rank takes its shard from its own memory tier, else from the rank holding its peer copy,
        else from S3. A shard that fails its checksums is skipped and the next source tried. A step
        saved with another world size is resharded: each rank gathers the saved shards from the nodes
        holding them, else from S3.
        """
        return self._loader.load(state_dict, step)

    @heartbeat.blocking("restore")
    def prepare_load(
        self, step: int | None = None, *, verify_first: bool = False, state_dict: dict[str, Any] | None = None
    ) -> tuple[int, TierStorageReader] | None:
        """Collective: choose the step, bring what this rank needs into reach, verify it; the step and a
        reader for it (None: nothing loadable). `load()` is this plus dcp.load; call `finish_load(step)`
        after reading."""
        return self._loader.prepare_load(step, verify_first=verify_first, state_dict=state_dict)

    @heartbeat.blocking("restore")
    def finish_load(self, step: int) -> None:
        """Remove what a prepared load fetched for `step` (collective like prepare_load)."""
        self._loader.finish_load(step)

    # ------------------------------------------------------------------ lifecycle
    @heartbeat.blocking("checkpoint")
    def close(self, *, keep_tier: bool = False, timeout: float | None = None) -> bool:
        """Finish pending copies and uploads (within `timeout`, default `timeout_s`), stop the background
        threads and, unless `keep_tier`, remove this job's memory tier on every node (collective).

        Keep the tier (`keep_tier=True`) when the job goes on elsewhere in this allocation: a preemption
        exit that auto-resume relaunches. A job that crashes never gets here; the Slurm epilog that
        `hpresilience install --role compute` sets up removes its tier. True when everything finished.
        """
        deadline = time.monotonic() + (self.cfg.timeout_s if timeout is None else timeout)
        ok = self.flush(timeout=max(0.0, deadline - time.monotonic()))
        stuck = self._post.stop(deadline)
        if self._inflight is not None and not self._inflight.done():
            stuck.append("save")  # DCP's writer thread, still in the save group's collective
        for hook in (self._step_hook, self._forward_hook):
            if hook is not None:
                hook.remove()
        self._step_hook = self._forward_hook = None
        self._stager.close(max(0.0, deadline - time.monotonic()))
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
