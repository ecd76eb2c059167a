#!/usr/bin/env python3
"""train.py with what the in-process mode falls back to: a checkpoint every few steps, and shards (gloo, CPU).

In-process recovery needs no checkpoint, but it cannot always finish (a second fault during the recovery, a bound
passed, a shard of which no replica survived): the wrapper then relaunches every rank the ordinary way, and
they resume from the last checkpoint (docs/auto-resume.md, "When in-process recovery falls back"). This script
is that shape at its smallest:

- every CKPT_EVERY steps each rank saves its model and optimizer to CKPT_DIR/step<k>/rank<r>.pt (atomically);
- started by the relaunch path (no HPR_WORLD_FILE), it resumes from the newest step that every rank saved,
  and says so (`restored rank=R step=K`); a rank of the in-process mode never reads a checkpoint (a
  replacement takes its state from a replica);
- SHARD_BLOCK=n: ranks [0, n) hold shard 0, [n, 2n) shard 1, ... (each shard its own weights, seeded by its
  number; the ranks of one shard are its data-parallel replicas): with n = the ranks per node, a node holds its
  shard's only replicas, so losing it loses the shard. Unset: one shard, pure DDP.

Environment: TRAIN_STEPS, STEP_SLEEP (as train.py), CKPT_DIR (required), CKPT_EVERY (default 5), SHARD_BLOCK.
Test hooks: NEW_RANK_DELAY: a replacement's rank (HPR_GENERATION > 1) sleeps this long before it joins (a slow
start, so that a second fault lands while the recovery still runs); DIE_RANKS / DIE_STEP: those ranks exit at
that step in the in-process mode's first world.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import torch
from train import batch, weights_digest  # the example's data and digest: train.py, beside this script

from hpresilience.torch.inprocess import InProcessLoop
from hpresilience.torch.world import Placement


def save(root: Path, step: int, rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    where = root / f"step{step}"
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f".rank{rank}.pt.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
    os.replace(tmp, where / f"rank{rank}.pt")


def newest_complete(root: Path, world_size: int) -> int | None:
    """The newest step every rank saved (a fault can cut a save short on some ranks)."""
    steps = []
    for d in root.glob("step*") if root.is_dir() else ():
        m = re.fullmatch(r"step(\d+)", d.name)
        if m and all((d / f"rank{r}.pt").is_file() for r in range(world_size)):
            steps.append(int(m.group(1)))
    return max(steps, default=None)


def main() -> None:
    steps = int(os.environ.get("TRAIN_STEPS", "100"))
    sleep = float(os.environ.get("STEP_SLEEP", "0.05"))
    root = Path(os.environ["CKPT_DIR"])
    every = int(os.environ.get("CKPT_EVERY", "5"))
    placement = Placement.from_env()
    block = int(os.environ.get("SHARD_BLOCK", "0"))
    shard = placement.rank // block if block > 0 else 0
    if placement.world_file and placement.generation > 1:
        time.sleep(float(os.environ.get("NEW_RANK_DELAY", "0")))
    torch.manual_seed(shard)  # the ranks of one shard build the same weights; shards differ
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    # The shard as a function of the rank: a warm standby (started before any fault) learns its rank only when
    # the loop's constructor returns; its weights come from a replica of that shard, whatever its seed.
    loop = InProcessLoop(model, optimizer, placement=placement, shard=lambda rank: rank // block if block > 0 else 0)
    if placement.fixed is not None:  # the relaunch path: resume from the last checkpoint, if any
        found = newest_complete(root, placement.fixed.world_size)
        if found is not None:
            state = torch.load(root / f"step{found}" / f"rank{loop.rank}.pt", weights_only=False)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            loop.completed = found
            print(f"restored rank={loop.rank} step={found}", flush=True)
    dying = {int(r) for r in os.environ.get("DIE_RANKS", "").split(",") if r}
    die_step = int(os.environ.get("DIE_STEP", "-1"))

    def compute(step: int) -> None:
        x, y = batch(loop.rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
        time.sleep(sleep)

    def on_step(done: int) -> None:
        if loop.rank == 0:
            print(f"step={done} generation={loop.generation} at={time.time():.3f}", flush=True)
        if done % every == 0:
            save(root, done, loop.rank, model, optimizer)
        if loop.rank in dying and done == die_step and placement.generation == 1 and placement.world_file:
            os._exit(1)

    done = loop.run(compute, steps, on_step)
    print(f"final rank={loop.rank} step={done} sha256={weights_digest(model)}", flush=True)
    loop.close()


if __name__ == "__main__":
    main()
