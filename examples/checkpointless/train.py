#!/usr/bin/env python3
"""Data-parallel training with no checkpoint at all, that survives the loss of a node (gloo, CPU).

Run under the in-process recovery mode, e.g. in an sbatch script on 3 nodes (2 training, 1 spare):

    hpresilience srun --auto-resume=1 --auto-resume-mode=inprocess --auto-resume-spares=1 \\
        --ntasks-per-node=2 python examples/checkpointless/train.py

Deterministic on purpose (a seeded model, each rank's data a function of its rank and the step), so that the final
weights of a run with faults can be compared bit for bit with those of a run without: the last line of rank 0 is
`final rank=0 step=N sha256=...`.

Environment: TRAIN_STEPS (default 100), STEP_SLEEP (seconds of "work" per step, default 0.05).
Test hooks (the tests only): DIE_RANK / DIE_STEP: that rank, in the in-process mode's first world, dies at that
step (os._exit);
SLOW_RANK: that rank sleeps 3x longer per step;
STEP_SLEEP_FILE: a file holding the seconds of "work" per step, read at every step (a test paces a long run
through its faults, then lets it finish at once);
HIDDEN: the hidden layer's width (default 32): a replacement started with another has a model its peers' state
does not fit.
"""

from __future__ import annotations

import hashlib
import os
import time

import torch

from hpresilience.torch.inprocess import InProcessLoop


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data for this step: the same whichever process computes it (a replacement's too)."""
    g = torch.Generator().manual_seed(100_003 * step + rank)
    return torch.randn(32, 16, generator=g), torch.randn(32, 4, generator=g)


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for _, t in sorted(model.state_dict().items()):
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def paced(path: str, default: float) -> float:
    if not path:
        return default
    try:
        with open(path) as f:
            return float(f.read().strip() or default)
    except (OSError, ValueError):
        return default


def main() -> None:
    steps = int(os.environ.get("TRAIN_STEPS", "100"))
    sleep = float(os.environ.get("STEP_SLEEP", "0.05"))
    torch.manual_seed(0)  # every rank of the first world builds the same model
    hidden = int(os.environ.get("HIDDEN", "32"))
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loop = InProcessLoop(model, optimizer)
    die_rank = int(os.environ.get("DIE_RANK", "-1"))
    die_step = int(os.environ.get("DIE_STEP", "-1"))
    slow = 3.0 if str(loop.rank) == os.environ.get("SLOW_RANK") else 1.0
    pace = os.environ.get("STEP_SLEEP_FILE", "")

    def compute(step: int) -> None:
        x, y = batch(loop.rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
        time.sleep(paced(pace, sleep) * slow)

    def on_step(done: int) -> None:
        if loop.rank == 0:
            print(f"step={done} generation={loop.generation} at={time.time():.3f}", flush=True)
        if loop.rank == die_rank and done == die_step and loop.placement.generation == 1 and loop.placement.world_file:
            os._exit(1)

    done = loop.run(compute, steps, on_step)
    print(f"final rank={loop.rank} step={done} sha256={weights_digest(model)}", flush=True)
    loop.close()


if __name__ == "__main__":
    main()
