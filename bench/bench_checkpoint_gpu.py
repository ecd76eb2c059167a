#!/usr/bin/env python3
"""Tiered checkpoints of state that lives on a CUDA GPU, as in training (needs a GPU; prints figures as ratios).

  1. blocking time of TieredCheckpointer.async_save (memory tier) for GPU state: the default (the whole
     device-to-host copy inside the call) and background staging, against the baseline of a plain
     device-to-host copy of the same tensors into pinned host buffers, and a synchronous DCP
     FileSystemWriter save of the same state into the same tmpfs;
  2. what a save guarantees on the device: after the save returns, the GPU state is overwritten through the
     write paths docs/checkpoints.md names (in-place op, .data, copy_ under no_grad, nn.init, an optimizer
     step); load() must give back the values at the save, bit for bit;
  3. restore into GPU tensors vs a host-to-device copy of the same bytes from pinned buffers.

Usage: bench/bench_checkpoint_gpu.py [--size-gib 2.0] [--dir /dev/shm] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from hpresilience.log import setup_logging
from hpresilience.torch import CheckpointConfig, TieredCheckpointer

warnings.filterwarnings("ignore")
GIB = 1 << 30


def synced(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def model_on_gpu(size_gib: float, layers: int = 16) -> torch.nn.Sequential:
    width = int((size_gib * GIB / 4 / layers) ** 0.5)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).cuda()


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure")
        return 3
    setup_logging("error", json=True)
    work = Path(tempfile.mkdtemp(prefix="hpr-gpu-bench-", dir=args.dir))
    model = model_on_gpu(args.size_gib)
    state = model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    print(
        f"state: {nbytes / GIB:.2f} GiB in {len(state)} CUDA tensors on {torch.cuda.get_device_name()}; "
        f"torch {torch.__version__}; tier {work}"
    )
    try:
        pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in state.items()}
        d2h = statistics.median(
            synced(lambda: [pinned[k].copy_(v) for k, v in state.items()]) for _ in range(args.repeat + 1)
        )
        fs_times = []
        for i in range(args.repeat):
            d = work / f"fs{i}"
            fs_times.append(synced(lambda d=d: dcp_save(state, storage_writer=FileSystemWriter(str(d)))))
            shutil.rmtree(d)
        fs = statistics.median(fs_times)
        for background in (False, True):
            cfg = CheckpointConfig(
                namespace="gpu", memory_dir=str(work / "tier"), keep=1, background_staging=background, replicate=False
            )
            ck = TieredCheckpointer(cfg)
            blocking = []
            for step in range(1, args.repeat + 2):
                torch.cuda.synchronize()
                t = time.perf_counter()
                fut = ck.async_save(state, step)
                blocking.append(time.perf_counter() - t)
                ck.wait_staged()
                fut.result()
                ck.flush()
            ck.close()
            shutil.rmtree(work / "tier", ignore_errors=True)
            blk = statistics.median(blocking[1:])
            mode = "background staging (opt-in)" if background else "default (inline copy)"
            print(
                f"[1] {mode}: async_save blocking {blk:.3f} s | device-to-host copy into pinned buffers "
                f"{d2h:.3f} s ({nbytes / d2h / 1e9:.1f} GB/s): ratio {blk / d2h:.0%} | sync FileSystemWriter "
                f"{fs:.3f} s: ratio {blk / fs:.1%}"
            )

        # 2. the saved step survives every documented write path on the device.
        cfg = CheckpointConfig(namespace="torn", memory_dir=str(work / "torn"), keep=2, replicate=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        with TieredCheckpointer(cfg) as ck:
            expect = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            fut = ck.async_save(model.state_dict(), 1)
            params = list(model.parameters())
            params[-1].data.mul_(0)
            with torch.no_grad():
                params[-2].copy_(torch.zeros_like(params[-2]))
                params[0].add_(1.0)
            torch.nn.init.zeros_(params[1])
            model(torch.ones(4, params[0].shape[1], device="cuda")).sum().backward()
            opt.step()
            fut.result()
            ck.flush()
            target = {k: torch.empty_like(v) for k, v in model.state_dict().items()}
            step = ck.load(target)
            same = sum(torch.equal(target[k].cpu(), expect[k]) for k in expect)
            print(
                f"[2] after in-place op, .data, copy_ under no_grad, nn.init and an optimizer step on the GPU: "
                f"load() gave step {step} with {same} of {len(expect)} tensors bit-identical to the state at "
                f"the save (goal: all)"
            )
            if same != len(expect):
                return 1

        # 3. restore into GPU tensors vs host-to-device copies from pinned buffers.
        cfg = CheckpointConfig(namespace="restore", memory_dir=str(work / "rs"), keep=1, replicate=False)
        with TieredCheckpointer(cfg) as ck:
            ck.save(state, 1)
            ck.flush()
            target = {k: torch.empty_like(v) for k, v in state.items()}
            loads, h2ds = [], []
            for _ in range(args.repeat):
                loads.append(synced(lambda t=target: ck.load(t)))
                h2ds.append(synced(lambda t=target: [t[k].copy_(pinned[k]) for k in t]))
            ld, h2d = statistics.median(loads), statistics.median(h2ds)
            print(
                f"[3] restore from the memory tier into GPU tensors {ld:.3f} s ({nbytes / ld / 1e9:.1f} GB/s) | "
                f"host-to-device copy from pinned buffers {h2d:.3f} s: restore speed {h2d / ld:.0%} of it"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
