#!/usr/bin/env python3
"""The user's own training script for the HyperPod recipe: torch DDP (gloo, CPU) with plain torch.save
checkpoints every CKPT_EVERY steps in CKPT_DIR (a shared directory), resumed on start.

The data of a step depends only on (step, rank), so a run interrupted and resumed from its checkpoint ends
with the same weights as an uninterrupted one (`reference()`): `training finished step=N weight0=W`.
Environment: CKPT_DIR (default ./ckpt), TRAIN_STEPS (40), CKPT_EVERY (5), TRAIN_STEP_SLEEP (0.2 s),
DIST_TIMEOUT_S (600: a collective that waits longer fails).

Each rank calls `heartbeat.beat(step)` once per step (hpresilience.torch; a no-op outside
`srun --auto-resume=1`), with its own work timed by `heartbeat.working()`: the wrapper then sees every
rank's progress and step time, for hang attribution and stragglers (docs/hangs.md).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

try:
    from hpresilience.torch import heartbeat
    from hpresilience.torch.preemption import PreemptionWatcher
    from hpresilience.torch.settings import PreemptionConfig
except ImportError:  # the script also runs where hpresilience is not installed
    heartbeat = None  # type: ignore[assignment]
    PreemptionWatcher = None  # type: ignore[assignment,misc]


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5


def new_model() -> tuple[torch.nn.Linear, torch.optim.SGD]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def reference(steps: int, world: int) -> float:
    """weight0 after `steps` uninterrupted steps on `world` ranks (DDP averages the ranks' gradients)."""
    model, opt = new_model()
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(x), y) for x, y in (batch(step, r) for r in range(world)))
        (loss / world).backward()  # type: ignore[operator]
        opt.step()
    return float(model.weight.detach().flatten()[0])


def save(ckpt: Path, model: torch.nn.Linear, opt: torch.optim.SGD, step: int, rank: int) -> None:
    if rank != 0:
        return
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    tmp = ckpt.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, tmp)
    tmp.replace(ckpt)


def moving(alive: bool) -> bool:
    """Whether any rank got the notice: every rank must stop at the same step, or the others would wait in
    the next collective for the ones that left."""
    flag = torch.tensor([0.0 if alive else 1.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def main() -> int:
    steps = int(os.environ.get("TRAIN_STEPS", "40"))
    every = int(os.environ.get("CKPT_EVERY", "5"))
    pause = float(os.environ.get("TRAIN_STEP_SLEEP", "0.2"))
    ckpt = Path(os.environ.get("CKPT_DIR", "ckpt")) / "checkpoint.pt"
    timeout = timedelta(seconds=float(os.environ.get("DIST_TIMEOUT_S", "600")))
    dist.init_process_group("gloo", timeout=timeout)  # torchrun sets RANK, WORLD_SIZE, MASTER_*
    rank = dist.get_rank()
    model, opt = new_model()
    ddp = DistributedDataParallel(model)
    step = 0
    if ckpt.exists():
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        step = int(saved["step"])
        if rank == 0:
            print(f"resumed from step {step}", flush=True)
    # The wrapper's notice of a planned move (grow back to full size): only the notice file, no signal handler,
    # so that SIGTERM still ends the script at once as before.
    notice = PreemptionWatcher(PreemptionConfig(signals=())).start() if PreemptionWatcher is not None else None
    while step < steps:
        if notice is not None and moving(notice.alive()):
            # When each rank stopped, and whether it saw the notice itself (the all-reduce stops it either way).
            print(f"moving: rank {rank} stopped at {time.time():.3f} check_alive={notice.alive()}", flush=True)
            save(ckpt, model, opt, step, rank)
            if rank == 0:
                print(f"moving: saved at step {step}", flush=True)
            dist.destroy_process_group()
            return 0
        step += 1
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
        if rank == 0:
            print(f"step={step}", flush=True)
            if step % every == 0:
                save(ckpt, model, opt, step, rank)
        if heartbeat is None:
            time.sleep(pause)
            continue
        with heartbeat.working():
            time.sleep(pause)  # stands for the rank's own work (data loading, compute) between collectives
        heartbeat.beat(step)
    if rank == 0:
        print(f"training finished step={step} weight0={float(model.weight.detach().flatten()[0]):.6f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
