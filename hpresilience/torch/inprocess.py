"""A data-parallel step loop that survives the loss of a node without restarting (issue 33; gloo, CPU).

Run under `srun --auto-resume=1 --auto-resume-mode=inprocess`: the wrapper runs a step per node and, when a node
is lost, writes the new world to HPR_WORLD_FILE (hpresilience/torch/world.py) and starts the replacement's ranks.

    loop = InProcessLoop(model, optimizer)
    def compute(step):                      # forward + backward on this rank's data for `step`; no collective
        loss_fn(model(inputs(step, loop.rank))).backward()
    loop.run(compute, steps=1000)           # averages the gradients (one all-reduce a step) and applies them

The loop owns the one collective of a step (the gradient all-reduce) and the optimizer's step, which is what lets it
keep the replicas equal through a fault:

- A survivor whose all-reduce fails (gloo raises when a peer's connection closes), or which finds a newer world at
  the start of a step, abandons the step in flight, destroys the process group, keeps model and optimizer in
  memory, waits for the new world (bounded: world_wait_s) and joins it (a new TCPStore on the new port).
- The ranks agree on the last completed step: the highest any rank reached. A rank's all-reduce can complete while
  another's fails (ring all-reduce: the dead peer's data had already arrived at one and not the other), so ranks
  differ by at most one step. A rank one step behind receives the averaged gradients of that step from a rank
  that completed it (every rank keeps the last step's averaged gradients) and applies them: the same update on the
  same state, so the replicas stay equal bit for bit and no step is computed twice.
- The replacement's ranks start with no state: they receive model and optimizer state from a survivor that holds
  the same shard (dealt round, so several new ranks take it from several peers at once; a survivor caught up by
  the gradients counts as one at the top step), tensor by tensor into their own model (transfer.py), and report
  which rank it came from.
- Shards (HSDP-like): a rank declares the shard it holds (`shard=`: a number, or a function of the rank, which a
  warm standby learns only at its assignment; default 0: pure DDP, every rank a replica of
  every other). Ranks of one shard are its replica group: the gradients are averaged within it, and only they
  can give a new rank that shard's state. At every join the ranks exchange (shard, completed step), so all of
  them know who holds what.
- A warm standby (a hot spare's rank started ahead of any fault, HPR_STANDBY_NODE; torch/standby.py) runs the same
  code: the loop's constructor blocks until the wrapper names its node in a world, then it is that world's new
  rank. So `loop.rank` is known to everything after the constructor, on every rank.

A rank that cannot finish its part exits with EXIT_INPROCESS_GAVE_UP, and the wrapper falls back to the relaunch
path from the last checkpoint: no world within the bound, a world without its rank, a shard of which no survivor
holds a replica (every holder was lost), a shard whose holders are all a step behind the others. Every rank of
the new world decides the same from the same exchanged table, so all of them give up together.
Rank 0 of each world writes the formed-world report (worldreport.py) once the first step in it completed: the
wrapper's sign that the recovery finished (a fault before it is a second fault during recovery), and the
recovery's parts for the ledger. Each rank prints one line per world it
joins (`hpr-inprocess joined ...`): the recovery's figures, read by the tests and the bench.
"""

from __future__ import annotations

import datetime
import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hpresilience.torch.agreement import (
    NEW,
    GaveUp,
    Recovery,
    formed_of,
    replica_group,
    shard_holders,
    state_pairs,
)
from hpresilience.torch.heartbeat import Heartbeat
from hpresilience.torch.joining import open_store
from hpresilience.torch.standby import await_assignment
from hpresilience.torch.transfer import StateRefused, receive_state, send_state
from hpresilience.torch.world import EXIT_INPROCESS_GAVE_UP, Placement, World, WorldFileError, read_world
from hpresilience.torch.worldreport import write_formed

WORLD_POLL_S = 0.05
WAIT_VAR = "HPR_WORLD_WAIT_S"
SPIN_S = 0.0005  # the wait between looks at a running all-reduce: what a step pays for being watched


class WorldMoved(Exception):
    """A newer world was announced while this rank was in a collective."""


class InProcessLoop:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        world_wait_s: float | None = None,
        collective_timeout_s: float = 60.0,
        placement: Placement | None = None,
        shard: int | Callable[[int], int] = 0,
        out: Any = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        # How long a survivor waits for the wrapper's new world (a replacement may have to be grown into the job).
        self.world_wait_s = world_wait_s if world_wait_s is not None else float(os.environ.get(WAIT_VAR, "300"))
        self.collective_timeout = datetime.timedelta(seconds=collective_timeout_s)
        # Everything alive now (torch's modules, the model: hundreds of thousands of objects) moves to the
        # collector's permanent generation: the gc.collect() of every teardown (close) then looks only at what
        # was made since. Measured under load here: 2.3-3.4 s per collect before, 0.000 s after; it was most of
        # a survivor's time from the new world to training in it.
        gc.freeze()
        self.out = out or sys.stdout
        self.placement = placement or Placement.from_env()
        self._born_at: float | None = None  # a standby's: when its assignment came (its recovery's start)
        if self.placement.standby_node:
            # A warm standby (hpresilience/torch/standby.py): model built, in no world yet; its rank is known once
            # the wrapper names its node, so the loop's start waits here and the code after it sees its rank.
            try:
                self.placement, _, self._born_at = await_assignment(self.placement, self._say)
            except WorldFileError as err:
                self._say(f"hpr-inprocess gave_up rank=- why={str(err)!r}")
                sys.exit(EXIT_INPROCESS_GAVE_UP)
        self.rank = self.placement.rank
        # A rank of the first world starts from the same seeded state as its peers; a later one has no state.
        self.completed = 0 if self.placement.generation == 1 else NEW
        self.generation = self.placement.generation - 1  # the world to join is at least the one we were born in
        self.world: World | None = None
        self.last_grads: torch.Tensor | None = None
        self.last_grads_step = 0
        self.recoveries: list[Recovery] = []
        self._world_seen: tuple[int, int, int] | None = None  # the world file's (mtime, size, inode) last read
        self.params = [p for p in model.parameters() if p.requires_grad]
        # A callable is asked once the rank is known: a warm standby learns its rank only in the constructor.
        self.shard = shard(self.rank) if callable(shard) else shard
        if self.shard < 0:
            raise ValueError(f"shard must be >= 0, not {self.shard}")
        self.replicas: Any = None  # this shard's replica group (None: the whole world is one)
        self.replica_size = 1
        self._unreported: Recovery | None = None  # joined; its first step after not completed yet
        # The wrapper's hang watch reads these (autoresume/inprocess_watch.py). The global rank, not the step's
        # SLURM_PROCID: with a step per node every node's tasks count from 0, and the hang's attribution names a
        # rank's node by the (node, pid) its beats came from.
        self.heartbeat = Heartbeat({**os.environ, "RANK": str(self.rank)})

    # -- the step loop -------------------------------------------------------------------------------
    def run(self, compute: Callable[[int], None], steps: int, on_step: Callable[[int], None] | None = None) -> int:
        """Train until `steps` steps are completed; the steps completed (== steps). Exits the process with
        EXIT_INPROCESS_GAVE_UP when the recovery cannot finish."""
        try:
            if self.world is None:
                self._recover("start")
            while self.completed < steps:
                if self._world_moved():
                    self._recover("new_world")
                    continue
                step = self.completed
                self.optimizer.zero_grad(set_to_none=False)
                compute(step)
                flat = torch.cat([_grad(p).reshape(-1) for p in self.params])
                failure = ""
                try:
                    self._all_reduce(flat)
                except WorldMoved:
                    failure = "new_world"
                except (RuntimeError, TimeoutError) as err:  # gloo: a peer closed, reset, or timed out
                    failure = f"collective_failed: {str(err)[:120]}"
                if failure:
                    # Outside the handler: the exception's frames hold the old group, whose connections stay
                    # open while anything refers to it, and a peer that enters the collective late would wait on
                    # them for the whole collective timeout instead of failing at once.
                    self._recover(failure)
                    continue
                flat /= self.replica_size
                self._apply(flat, step)
                if self._unreported is not None:
                    self._report(self._unreported)
                self.heartbeat.beat(self.completed)
                if on_step is not None:
                    on_step(self.completed)
            return self.completed
        except GaveUp as why:
            self._say(f"hpr-inprocess gave_up rank={self.rank} why={str(why)!r}")
            self.close()
            sys.exit(EXIT_INPROCESS_GAVE_UP)

    @property
    def world_size(self) -> int:
        return self.world.world_size if self.world is not None else 1

    def close(self) -> None:
        """Leave the process group, and let go of it at once (gc): its connections close only when the group
        is gone, and that is what makes a peer still in a collective on it fail rather than wait."""
        if not dist.is_initialized():
            return
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        try:
            if abort is not None:
                abort()
            if dist.is_initialized():
                dist.destroy_process_group()
        except (RuntimeError, ValueError, AssertionError):
            pass
        gc.collect()

    def _all_reduce(self, flat: torch.Tensor) -> None:
        """The step's all-reduce, watching the world file while it runs: a peer that is gone does not always
        make gloo fail at once (a rank waiting on a live peer that itself waits), and the wrapper's new world
        says so sooner than the collective timeout. With shards, the gradients are averaged within the replica
        group, and a one-number all-reduce over the world keeps the shards in step (what the shard group's own
        collectives do in a real HSDP step): a shard's loss stops every rank, not just that shard's peers."""
        works = [dist.all_reduce(flat, group=self.replicas, async_op=True)]
        if self.replicas is not None:
            works.append(dist.all_reduce(torch.zeros(1), async_op=True))
        next_look = time.monotonic() + WORLD_POLL_S
        while not all(w.is_completed() for w in works):
            time.sleep(SPIN_S)
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + WORLD_POLL_S
                if self._world_moved():
                    raise WorldMoved()
        for work in works:
            work.wait()

    def _apply(self, flat: torch.Tensor, step: int) -> None:
        """The averaged gradients of `step` into the parameters' grads, then the optimizer's step."""
        offset = 0
        for p in self.params:
            n = p.numel()
            _grad(p).copy_(flat[offset : offset + n].view_as(p))
            offset += n
        self.optimizer.step()
        self.last_grads, self.last_grads_step = flat, step + 1
        self.completed = step + 1

    def _world_moved(self) -> bool:
        """Whether the wrapper wrote a newer world. A stat per look, the file read only when it changed: every
        rank looks at every step, and the file lies on a shared file system."""
        if not self.placement.world_file:
            return False
        try:
            st = os.stat(self.placement.world_file)
        except OSError:
            return False
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen == self._world_seen:
            return False
        try:
            world = read_world(self.placement.world_file)
        except (OSError, WorldFileError):
            return False  # caught again, and said, by the recovery's own read (_wait_world)
        self._world_seen = seen
        return world is not None and world.generation > self.generation

    # -- recovery ------------------------------------------------------------------------------------
    def _recover(self, cause: str) -> None:
        """Leave the old group, join the newest world, agree on the step, pass state on; one Recovery."""
        record = Recovery(self.generation, cause, self.completed)
        if self._born_at is not None:  # a standby's recovery started when its assignment was seen
            record.started_at, self._born_at = self._born_at, None
        self.close()
        record.torn_down_at = time.time()
        deadline = time.monotonic() + self.world_wait_s
        while True:
            world = self._wait_world(deadline)
            try:
                self._join(world)
                record.group_at = time.time()
                self._agree(record)
                break
            except (RuntimeError, TimeoutError) as err:
                # A second fault while joining: the wrapper writes a newer world; join that one.
                self._say(f"hpr-inprocess join_failed rank={self.rank} generation={world.generation} err={err!s:.120}")
                self.close()
                if time.monotonic() > deadline:
                    raise GaveUp(f"no world could be joined within {self.world_wait_s:g} s") from None
        record.generation, record.step, record.joined_at = self.generation, self.completed, time.time()
        self.recoveries.append(record)
        self._unreported = record
        self._say(
            f"hpr-inprocess joined rank={self.rank} pid={os.getpid()} generation={self.generation} "
            f"world_size={self.world_size} step={self.completed} cause={cause.split(':')[0]} "
            f"state_from={_show(record.state_from)} grads_from={_show(record.grads_from)} "
            f"recovery_s={record.seconds:.3f} group_s={record.group_at - record.started_at:.3f} "
            f"at={record.joined_at:.3f}"
        )

    def _wait_world(self, deadline: float) -> World:
        """The first world newer than the one this rank was in, that has this rank."""
        while True:
            if not self.placement.world_file:  # the relaunch path: one world; a failure ends the step
                if self.placement.fixed is None or self.generation >= 1:
                    raise GaveUp("a collective failed outside the in-process mode: the step restarts")
                return self.placement.fixed
            try:
                world = read_world(self.placement.world_file)
            except (OSError, WorldFileError) as err:
                raise GaveUp(str(err)) from None
            if world is not None and world.generation > self.generation:
                if self.rank >= world.world_size:
                    raise GaveUp(f"rank {self.rank} is not in generation {world.generation}'s world")
                return world
            if time.monotonic() > deadline:
                raise GaveUp(f"no new world within {self.world_wait_s:g} s")
            time.sleep(WORLD_POLL_S)

    def _join(self, world: World) -> None:
        self.generation, self.world = world.generation, world
        store = open_store(world, self.rank, self.collective_timeout, self._world_moved)
        dist.init_process_group(
            "gloo", store=store, rank=self.rank, world_size=world.world_size, timeout=self.collective_timeout
        )

    def _agree(self, record: Recovery) -> None:
        """Bring every rank to the highest completed step, each from a replica of its own shard (see the
        module's docstring); GaveUp, on every rank alike, when a shard has no replica that can."""
        table = [torch.zeros(2, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(table, torch.tensor([self.shard, self.completed], dtype=torch.int64))
        shard_of = {r: int(t[0]) for r, t in enumerate(table)}
        done = {r: int(t[1]) for r, t in enumerate(table)}
        holders, top = shard_holders(shard_of, done)
        self._replica_group(holders)
        mine = holders[self.shard]
        record.state_to = sum(1 for d in done.values() if d == NEW or d < top - 1)
        record.grads_to = sum(1 for d in done.values() if d == top - 1) if top > 0 else 0
        source = min(r for r in mine if done[r] == top)
        if top > 0 and any(done[r] == top - 1 for r in mine):
            if self.rank == source and (self.last_grads is None or self.last_grads_step != top):
                raise GaveUp(f"rank {self.rank} lacks step {top}'s gradients for the ranks one step behind")
            flat = self.last_grads if self.rank == source and self.last_grads is not None else self._empty_flat()
            dist.broadcast(flat, src=source, group=self.replicas)
            if self.completed == top - 1:
                self._apply(flat, self.completed)
                record.grads_from = source
        self._pass_state(state_pairs(mine, done, top), top, record)
        if record.state_to:
            # Every rank learns whether every transfer of the world went through, so all go on or all give up.
            ok = torch.tensor([0 if record.refused else 1], dtype=torch.int64)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if not int(ok):
                raise GaveUp(record.refused or "a new rank refused its peer's state (its gave_up line says why)")

    def _pass_state(self, pairs: dict[int, int], top: int, record: Recovery) -> None:
        """Send this rank's state to the ranks it was dealt, or receive its own (transfer.py)."""
        for receiver, source in pairs.items():
            if source == self.rank:
                send_state(self.model, self.optimizer, top, receiver, self.replicas)
        if self.rank not in pairs:
            return
        # The tensors are written in place: from here until the last byte this rank holds no usable state, and a
        # fault midway leaves it a new rank in the next world, not a half-updated replica.
        self.completed, self.last_grads = NEW, None
        try:
            self.completed = receive_state(self.model, self.optimizer, pairs[self.rank], self.replicas)
        except StateRefused as why:
            record.refused = f"rank {self.rank} cannot take rank {pairs[self.rank]}'s state: {why}"
            return
        record.state_from = pairs[self.rank]

    def _replica_group(self, holders: dict[int, list[int]]) -> None:
        self.replicas, self.replica_size = replica_group(holders, self.shard, self.world_size)

    def _report(self, record: Recovery) -> None:
        """The world formed (its first step completed): rank 0 says so, with the parts, for the wrapper."""
        self._unreported = None
        if self.rank != 0 or not self.placement.world_file:
            return
        formed = formed_of(record, self.generation, time.time())
        try:
            write_formed(self.placement.world_file, formed)
        except OSError as err:  # the wrapper then sees no formed world: it falls back at its bound
            self._say(f"hpr-inprocess report_failed rank={self.rank} err={err!s:.120}")

    def _empty_flat(self) -> torch.Tensor:
        return torch.zeros(
            sum(p.numel() for p in self.params), dtype=self.params[0].dtype, device=self.params[0].device
        )

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)


def _grad(p: torch.Tensor) -> torch.Tensor:
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


def _show(rank: int | None) -> str:
    return "-" if rank is None else str(rank)
