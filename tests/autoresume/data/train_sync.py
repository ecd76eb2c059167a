"""Synchronous data-parallel training as users write it (torch CPU, gloo): one all-reduce per step, only rank 0
prints `step N` (every STEP_SLEEP seconds) and checkpoints (torch.save to CKPT_DIR every step); a relaunch resumes
from it (`resumed from step N`). PAUSE_AT / PAUSE_S: every rank sleeps that long after that step (a long
evaluation: the whole step silent, every node reachable). Rank, world and master come from the wrapper's
environment (SLURM_PROCID, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=600))
    ckpt = Path(os.environ["CKPT_DIR"]) / "ckpt.pt"
    step = int(torch.load(ckpt)["step"]) if ckpt.exists() else 0
    if rank == 0 and step:
        print(f"resumed from step {step}", flush=True)
    steps, every = int(os.environ.get("TRAIN_STEPS", "1000000")), float(os.environ.get("STEP_SLEEP", "0.5"))
    pause_at, pause_s = int(os.environ.get("PAUSE_AT", "0")), float(os.environ.get("PAUSE_S", "0"))
    while step < steps:
        step += 1
        total = torch.tensor([float(step)])
        dist.all_reduce(total)  # blocks every rank while one node is cut off
        if rank == 0:
            assert int(total.item()) == step * world
            print(f"step {step}", flush=True)
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"step": step}, tmp)
            tmp.replace(ckpt)
        if step == pause_at:
            if rank == 0:
                print(f"evaluating for {pause_s:g} s", flush=True)
            time.sleep(pause_s)
        time.sleep(every)
    if rank == 0:
        print(f"training finished step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
