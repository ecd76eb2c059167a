#!/usr/bin/env python3
"""The replica check's per-step overhead (hpresilience.torch.ReplicaCheck, docs/integrity.md), as a ratio of
step time, at the default interval (every 100 steps; goal <= 1 %).

Two spawned gloo ranks on this machine train an MLP under DDP with SGD and momentum (the state the check hashes:
parameters and momentum buffers). Measured in the same run: the mean time of a training step, and the mean
time of one check (digest of every parameter and optimizer tensor, then the all_gather of the digests), over
--checks checks. The overhead per step at interval N is check_s / (N x step_s). The figure depends on the ratio
of compute to state size: a CPU MLP is a pessimistic case (its step is cheap for its size; a GPU model's step
does far more arithmetic per parameter, and the check sums on the device).

Usage: bench/bench_replica_check.py [--params-m 4] [--steps 200] [--checks 20] [--every 100]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from hpresilience.torch import ReplicaCheck, ReplicaCheckConfig

    width = int((args.params_m * 1e6 / 3) ** 0.5)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    check = ReplicaCheck(model, opt, ReplicaCheckConfig(every=args.every))
    x = torch.randn(args.batch, width)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    for _ in range(5):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    step_s = (time.perf_counter() - t0) / args.steps
    checks = []
    for i in range(args.checks):
        step()
        dist.barrier()
        t = time.perf_counter()
        verdict = check.check(i)
        checks.append(time.perf_counter() - t)
        assert verdict.ok
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        out.put((n, step_s, statistics.median(checks)))
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params-m", type=float, default=4.0, help="millions of parameters")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checks", type=int, default=20)
    p.add_argument("--every", type=int, default=100)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(_worker, args=(2, _free_port(), args, out), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    n, step_s, check_s = out.get()
    ratio = check_s / (args.every * step_s)
    print(f"state: {n / 1e6:.2f} M parameters + momentum, 2 gloo ranks (DDP, CPU)")
    print(f"training step: {step_s * 1e3:.2f} ms (mean of {args.steps})")
    print(f"replica check: {check_s * 1e3:.2f} ms (median of {args.checks}: digest + all_gather of digests)")
    print(f"replica check overhead at every={args.every}: {ratio * 100:.3f} % of step time (goal <= 1 %)")
    return 0 if ratio <= 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
