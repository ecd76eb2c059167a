#!/usr/bin/env python3
"""A tiny deterministic data-parallel training job (torch CPU, gloo) that checkpoints with hpresilience.

Run under Slurm (`srun --auto-resume=1 python examples/train_gloo.py --steps 40`) or by hand with
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT. It resumes from the newest checkpoint on start, prints
`step=N loss=X` per step on rank 0, saves every --ckpt-every steps, and on a preemption notice
(SIGUSR1 from `--signal=USR1@60`, SIGTERM, the agent's notice file) saves and exits with 143 so the
wrapper relaunches it. The data of step N depends only on N, so an interrupted and resumed run ends
at the same step with the same weights as an uninterrupted one: `training finished step=N`.

Environment: HPR_CKPT_DIR (memory tier folder; give each simulated node its own when all "nodes" are one
machine), HPR_CKPT_S3 / HPR_CKPT_S3_EVERY / AWS_ENDPOINT_URL_S3 (S3 tier), HPR_NOTICE_FILE, TRAIN_STEPS,
CKPT_EVERY, TRAIN_STEP_SLEEP.
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

from hpresilience.torch import CheckpointConfig, PreemptionConfig, TieredCheckpointer, check_alive, install

PREEMPTED_EXIT = 143  # 128 + SIGTERM: "stopped from outside", so a supervisor relaunches


def _env(*names: str, default: str) -> str:
    for n in names:
        if os.environ.get(n):
            return os.environ[n]
    return default


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=int(_env("TRAIN_STEPS", default="40")))
    p.add_argument("--ckpt-every", type=int, default=int(_env("CKPT_EVERY", default="5")))
    p.add_argument(
        "--sleep",
        type=float,
        default=float(_env("TRAIN_STEP_SLEEP", default="0")),
        help="seconds per step, to leave time to interrupt a demo run",
    )
    p.add_argument("--memory-dir", default=_env("HPR_CKPT_DIR", default="/dev/shm/hpresilience-{uid}"))
    p.add_argument("--namespace", default=f"train-gloo-{_env('SLURM_JOB_ID', default='local')}")
    p.add_argument("--s3-base", default=os.environ.get("HPR_CKPT_S3") or None)
    p.add_argument("--s3-every", type=int, default=int(_env("HPR_CKPT_S3_EVERY", default="0")))
    p.add_argument(
        "--crash-at",
        type=int,
        default=int(_env("CRASH_AT", default="0")),
        help="rank 0 raises at this step on every attempt (a program bug: `hpresilience demo --scenario crash-loop`)",
    )
    return p.parse_args()


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of a step depends only on (step, rank): replays after a resume are identical."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5
    return x, y


def main() -> int:
    args = parse_args()
    rank = int(_env("SLURM_PROCID", "RANK", default="0"))
    world = int(_env("SLURM_NTASKS", "WORLD_SIZE", default="1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    install(PreemptionConfig(notice_file=os.environ.get("HPR_NOTICE_FILE") or None))

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ckpt = TieredCheckpointer(
        CheckpointConfig(
            namespace=args.namespace,
            memory_dir=args.memory_dir,
            keep=2,
            s3_base=args.s3_base,
            s3_every=args.s3_every if args.s3_base else 0,
            s3_endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or None,
        )
    )

    def state(step: int) -> dict[str, object]:
        msd, osd = get_state_dict(model, opt)
        return {"model": msd, "optim": osd, "trainer": {"step": step}}

    start = 0
    restored = state(0)
    loaded = ckpt.load(restored)
    if loaded is not None:
        set_state_dict(model, opt, model_state_dict=restored["model"], optim_state_dict=restored["optim"])  # type: ignore[arg-type]
        start = int(restored["trainer"]["step"])  # type: ignore[index]
        if rank == 0:
            print(f"resumed from step={start}", flush=True)

    step = start
    while step < args.steps:
        step += 1
        if step == args.crash_at and rank == 0:
            raise RuntimeError(f"loss computation failed at step {step} (a bug in the program, not the node)")
        x, y = batch(step, rank, world)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if rank == 0:
            print(f"step={step} loss={loss.item():.4f}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
        # Every rank must agree to stop, or the ones that go on would hang in the next all-reduce.
        alive = torch.tensor([1 if check_alive() else 0])
        dist.all_reduce(alive, op=dist.ReduceOp.MIN)
        if not alive.item():
            ckpt.save(state(step), step)
            ckpt.close(keep_tier=True)  # the relaunched step restores from this node's memory
            if rank == 0:
                print(f"preempted: saved step={step}, exiting", flush=True)
            dist.destroy_process_group()
            return PREEMPTED_EXIT
        if step % args.ckpt_every == 0 and step < args.steps:
            ckpt.async_save(state(step), step)

    ckpt.save(state(step), step)
    ckpt.close()
    if rank == 0:
        w = model.module.weight.detach().flatten().tolist()
        print(f"training finished step={step} weight0={w[0]:.6f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
