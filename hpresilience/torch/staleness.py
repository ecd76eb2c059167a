"""Stale and backward restores: a save that holds the previous save's tensors, and a restore behind what the job
has already committed.

A stale save (NeMo-RL#3312: an asynchronous save that wrote the weights of the step before) passes every byte
check: its shards are intact, only their contents are old. Each rank's shard index already records a checksum per
saved item, so two steps are compared without reading a byte of them: when every tensor item of this rank's
shard at step S has the checksum it had at the previous step this rank saved, while the step moved on, the save at S
is stale. Training state changes at every optimizer step (the weights, and the optimizer's own moments and
counters), so equal tensors across steps mean the save did not capture the step it names.

- At save (postcommit.py, after the commit): the step is flagged (`checkpoint_stale_save`, an error in the log).
- At load (loading.py): a stale step is refused on every rank and the load falls back to the next step that
  passes; that step's weights are the same, with the right step number (training redoes the steps between).

A restore that lands behind the newest step committed anywhere the load could see (a node's memory tier, a
peer copy, the durable tier's listing: the job's committed high-water mark) is reported as going backwards
(`checkpoint_restore_behind`, with every reason a newer step was passed over), and with
`refuse_restore_behind` it is refused rather than silently redoing work (CheckpointConfig).

What it cannot see: a stale save of a rank whose previous step is no longer on its node (retention keeps
`keep` steps), a step held only in the durable tier or a peer copy (not compared), training that really leaves
every tensor unchanged (a zero learning rate with no optimizer state: flagged although right), and a save that
is wrong in another way than equal to the one before (its bytes are what it was given).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hpresilience.errors import HPResilienceError
from hpresilience.torch.layout import ShardIndex, shard_names
from hpresilience.torch.private import read_trusted

Key = tuple[str, tuple[int, ...] | None]


def tensor_checksums(index: ShardIndex) -> dict[Key, tuple[str, int]]:
    """The checksum of every tensor item of a shard (pickled items, such as a step counter, left out)."""
    return {k: (v.algo, v.checksum) for k, v in index.items.items() if v.dtype is not None}


def is_stale(previous: ShardIndex, current: ShardIndex) -> bool:
    """`current` (a later step) holds exactly `previous`'s tensors: every one, none added or dropped."""
    if current.step <= previous.step:
        return False
    now = tensor_checksums(current)
    return bool(now) and now == tensor_checksums(previous)


def read_index(step_dir: Path, rank: int) -> ShardIndex | None:
    """This rank's shard index in a step folder, or None when it is missing or unreadable."""
    path = step_dir / shard_names(rank)[1]
    try:
        return ShardIndex.from_json(read_trusted(path), str(path))
    except (HPResilienceError, OSError):
        return None


def stale_against(step: int, own_steps: list[int], step_dir_of: Callable[[int], Path], rank: int) -> int | None:
    """The previous step of `own_steps` whose tensors this rank's shard at `step` repeats, else None
    (`step_dir_of`: the memory tier's step folder of a step)."""
    earlier = [s for s in own_steps if s < step]
    if not earlier:
        return None
    prev_step = max(earlier)
    current = read_index(step_dir_of(step), rank)
    previous = read_index(step_dir_of(prev_step), rank)
    if current is None or previous is None:
        return None
    return prev_step if is_stale(previous, current) else None


def behind(chosen: int, committed: set[int]) -> int | None:
    """The newest committed step when the restore lands behind it, else None."""
    newest = max(committed, default=None)
    return newest if newest is not None and newest > chosen else None
