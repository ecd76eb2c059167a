#!/usr/bin/env python3
"""examples/train_gloo.py with the integrity checks of docs/integrity.md, and their faults on request.

Data parallel (DDP, gloo, CPU), deterministic: the data of step N depends only on (N, rank), so a run resumed
from a checkpoint ends with the same weights as one that never stopped. Per step: the step's loss in the
heartbeat (the wrapper's NaN and spike watch), the replica check every --check-every steps, a checkpoint every
--ckpt-every steps. After a rollback it restores no step newer than HPR_RESTORE_MAX_STEP (TieredCheckpointer
does) and skips the steps in HPR_SKIP_STEPS. Prints `resumed from step=S`, `skipped step=N`, and at the end
`training finished step=N weights=<digest>` (rank 0).

Faults (the demo's scenarios, `hpresilience demo --scenario sdc|nan`):
  --flip-node NODE --flip-step K   local rank 1 on NODE flips one bit of its weights after step K's update, in
                                   every attempt that runs there (a bad device reproduces its fault);
  --nan-step K                     step K's loss is NaN (its gradients too), unless step K is skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from hpresilience.torch import (
    CheckpointConfig,
    ReplicaCheck,
    ReplicaCheckConfig,
    TieredCheckpointer,
    heartbeat,
    should_skip,
    skip_steps,
)
from hpresilience.torch.integrity import tensor_digest


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--check-every", type=int, default=10)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--memory-dir", default=os.environ.get("HPR_CKPT_DIR") or "/dev/shm/hpresilience-{uid}")
    p.add_argument("--namespace", default=f"train-checked-{os.environ.get('SLURM_JOB_ID', 'local')}")
    p.add_argument("--flip-node", default="")
    p.add_argument("--flip-step", type=int, default=-1)
    p.add_argument("--nan-step", type=int, default=-1)
    return p.parse_args()


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5


def main() -> int:
    args = parse_args()
    rank = int(os.environ.get("SLURM_PROCID") or os.environ.get("RANK") or "0")
    world = int(os.environ.get("SLURM_NTASKS") or os.environ.get("WORLD_SIZE") or "1")
    local = int(os.environ.get("SLURM_LOCALID") or os.environ.get("LOCAL_RANK") or "0")
    node = os.environ.get("SLURMD_NODENAME", "")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ckpt = TieredCheckpointer(CheckpointConfig(namespace=args.namespace, memory_dir=args.memory_dir, keep=20))
    check = ReplicaCheck(model, opt, ReplicaCheckConfig(every=args.check_every))
    skips = skip_steps()

    def state(step: int) -> dict[str, object]:
        msd, osd = get_state_dict(model, opt)
        return {"model": msd, "optim": osd, "trainer": {"step": step}}

    step = 0
    restored = state(0)
    if ckpt.load(restored) is not None:
        set_state_dict(model, opt, model_state_dict=restored["model"], optim_state_dict=restored["optim"])  # type: ignore[arg-type]
        step = int(restored["trainer"]["step"])  # type: ignore[index]
        if rank == 0:
            print(f"resumed from step={step}", flush=True)
    while step < args.steps:
        step += 1
        if should_skip(step, skips):
            if rank == 0:
                print(f"skipped step={step}", flush=True)
            continue
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step == args.nan_step:
            loss = loss * float("nan")
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if step == args.flip_step and node == args.flip_node and local == 1:
            with torch.no_grad():  # one bit of one weight, in place: what a bad device does to memory
                model.module.weight.view(torch.int32)[0, 3] ^= 1 << 22
            print(f"bit flipped rank={rank} node={node} step={step}", flush=True)
        heartbeat.beat(step, loss=loss.item())
        if rank == 0:
            print(f"step={step} loss={loss.item():.4f}", flush=True)
        check.maybe(step)
        if args.sleep:
            time.sleep(args.sleep)
        if step % args.ckpt_every == 0 and step < args.steps:
            ckpt.save(state(step), step)
    ckpt.save(state(step), step)
    ckpt.close()
    if rank == 0:
        print(f"training finished step={step} weights={tensor_digest(check.tensors())}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
