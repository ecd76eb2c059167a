"""What the ranks of a new world decide together, from one exchanged table, before they train in it
(torch/inprocess.py): who holds which shard, the step every shard must reach, and whether one can; plus the record
of one recovery and the formed-world report made from it (worldreport.py).

Every rank gets the same table (shard, completed steps) from one all_gather, so every rank reaches the same
answer: all of them go on, or all of them give up (GaveUp, exit EXIT_INPROCESS_GAVE_UP) and the wrapper falls back
to the relaunch path. Torch-free: the decisions are plain arithmetic over the table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpresilience.torch.worldreport import Formed

NEW = -1  # the completed-step count a rank with no state reports


class GaveUp(Exception):
    """This rank cannot finish the in-process recovery."""


@dataclass
class Recovery:
    """One world joined: when, why, and what it cost (seconds, wall clock)."""

    generation: int
    cause: str
    step: int
    state_from: int | None = None  # the rank this one's state came from (a new rank)
    refused: str = ""  # why this rank could not take its peer's state (its model differs)
    grads_from: int | None = None  # the rank whose averaged gradients this one applied (one step behind)
    started_at: float = field(default_factory=time.time)
    torn_down_at: float = 0.0  # the old process group was gone
    group_at: float = 0.0  # the new process group was built
    joined_at: float = 0.0  # the step agreed on and state passed on
    state_to: int = 0  # ranks of the world that received state from a peer
    grads_to: int = 0  # ranks of the world that applied a peer's averaged gradients

    @property
    def seconds(self) -> float:
        return self.joined_at - self.started_at


def shard_holders(shard_of: Mapping[int, int], done: Mapping[int, int]) -> tuple[dict[int, list[int]], int]:
    """The ranks holding each shard (in rank order) and the highest step any rank completed. GaveUp when a shard
    has no replica that can bring its ranks there: all its holders new (every one that held it was lost), or all
    of them a step behind (no replica has that step's averaged gradients)."""
    holders: dict[int, list[int]] = {}
    for r in sorted(shard_of):
        holders.setdefault(shard_of[r], []).append(r)
    top = max(done.values())
    for shard, ranks in sorted(holders.items()):
        best = max(done[r] for r in ranks)
        if best == NEW:
            raise GaveUp(f"no survivor holds a replica of shard {shard} (its ranks {_span(ranks)} are all new)")
        if best < top:
            raise GaveUp(f"no replica of shard {shard} completed step {top} (its ranks reached {best})")
    return holders, top


def state_pairs(mine: Sequence[int], done: Mapping[int, int], top: int) -> dict[int, int]:
    """Which rank sends its state to which rank that needs it (new, or more than a step behind), within one
    shard's ranks: the receivers in rank order dealt round to the ranks at `top` in rank order, so a replaced
    node's ranks take their state from as many peers at once, not all from one. A rank one step behind counts as
    at `top`: it has applied step `top`'s gradients, broadcast before any state passes, as its replicas did (a
    survivor whose all-reduce the fault broke is often one step behind the rest)."""
    sources = [r for r in mine if done[r] == top or (top > 0 and done[r] == top - 1)]
    receivers = [r for r in mine if done[r] == NEW or done[r] < top - 1]
    return {r: sources[i % len(sources)] for i, r in enumerate(receivers)} if sources else {}


def replica_group(
    holders: Mapping[int, list[int]], shard: int, world_size: int, new_group: Callable[[list[int]], Any] | None = None
) -> tuple[Any, int]:
    """This rank's shard's replica group and its size. Every rank creates every group, in the same order
    (new_group is collective over the world); one shard is the world itself, with no group to build (None)."""
    if len(holders) == 1:
        return None, world_size
    if new_group is None:
        import torch.distributed as dist

        new_group = dist.new_group
    mine: tuple[Any, int] = (None, world_size)
    for s, ranks in sorted(holders.items()):
        group = new_group(ranks)
        if s == shard:
            mine = (group, len(ranks))
    return mine


def formed_of(record: Recovery, generation: int, now: float) -> Formed:
    """The formed-world report of `record` (its first step after completed at `now`)."""
    times = [record.started_at, record.torn_down_at, record.group_at, record.joined_at, now]
    for i in range(1, len(times)):  # one clock, but a part that was skipped keeps its predecessor's time
        times[i] = max(times[i], times[i - 1])
    return Formed(
        generation=generation,
        step=record.step,
        cause=record.cause.split(":")[0][:64],
        started_at=times[0],
        torn_down_at=times[1],
        joined_at=times[2],
        agreed_at=times[3],
        first_step_at=times[4],
        state_to=record.state_to,
        grads_to=record.grads_to,
    )


def _span(ranks: list[int]) -> str:
    return ",".join(map(str, ranks[:8])) + (",..." if len(ranks) > 8 else "")
