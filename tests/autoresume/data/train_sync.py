"""Synchronous data-parallel training as users write it (torch CPU, gloo): one all-reduce per step, only rank 0
prints `step N` (every STEP_SLEEP seconds) and checkpoints (torch.save to CKPT_DIR every step); a relaunch resumes
from it (`resumed from step N`, then `world W`). PAUSE_AT / PAUSE_S: every rank sleeps that long after that step (a
long evaluation: the whole step silent, every node reachable). Rank, world and master come from the wrapper's
environment (SLURM_PROCID, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

HEARTBEAT=1: every rank beats hpresilience.torch's heartbeat after the all-reduce, and times its own work in
`heartbeat.working()`. CPU_WORK=S: that work is S seconds of the rank's own CPU time before the all-reduce (not a
sleep), so a CPU quota on its node (`devcluster slow NODE --cpu F`) slows it as a slow host would. Each rank also
appends `step wall_s work_s` to CKPT_DIR/times-rank<R>.txt (a file, not the output: only rank 0 prints), for the
test to compare what a wall clock and a work clock see under synchronous training."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def main() -> None:
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=600))
    ckpt = Path(os.environ["CKPT_DIR"]) / "ckpt.pt"
    step = int(torch.load(ckpt)["step"]) if ckpt.exists() else 0
    if rank == 0:
        if step:
            print(f"resumed from step {step}", flush=True)
        print(f"world {world}", flush=True)
    steps, every = int(os.environ.get("TRAIN_STEPS", "1000000")), float(os.environ.get("STEP_SLEEP", "0.5"))
    pause_at, pause_s = int(os.environ.get("PAUSE_AT", "0")), float(os.environ.get("PAUSE_S", "0"))
    work = float(os.environ.get("CPU_WORK", "0"))
    beats = os.environ.get("HEARTBEAT") == "1"
    heartbeat: ModuleType | None = None
    if beats:
        from hpresilience.torch import heartbeat as hb

        heartbeat = hb
    times = Path(os.environ["CKPT_DIR"]) / f"times-rank{rank}.txt" if work else None

    @contextlib.contextmanager
    def working() -> Iterator[None]:
        with heartbeat.working() if heartbeat is not None else contextlib.nullcontext():
            yield

    while step < steps:
        step += 1
        began = time.monotonic()
        with working():
            burn(work)
        worked = time.monotonic() - began
        total = torch.tensor([float(step)])
        dist.all_reduce(total)  # blocks every rank while one node is cut off
        if heartbeat is not None:
            heartbeat.beat(step)
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
        if times is not None:
            with times.open("a") as f:
                f.write(f"{step} {time.monotonic() - began:.4f} {worked:.4f}\n")
    if rank == 0:
        print(f"training finished step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
