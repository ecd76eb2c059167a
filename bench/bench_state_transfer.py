#!/usr/bin/env python3
"""A survivor's model and Adam state sent to a new rank (issue 33), as the in-process loop does it, over gloo on
this machine's loopback; prints figures as ratios against baselines measured in the same run:

  tensor   hpresilience.torch.transfer (point to point, tensor by tensor into the receiver's own tensors);
  pickled  the loop's first way: one broadcast_object_list of {model, optimizer} state_dicts, then
           load_state_dict (what it replaced);
  wire     one gloo send of a single flat buffer of the same bytes (the fastest the loopback moves them);
  with --device cuda (needs a GPU; both ranks on it, as gloo allows): the receiver's model on the GPU, against a
           host-to-device copy of the same bytes from pinned buffers (the issue's goal: >= 70 % of it).

Each figure is one fresh pair of processes; the receiver's peak memory is its maximum RSS growth over the
transfer. Usage: bench/bench_state_transfer.py [--size-mib 256] [--repeat 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1 << 20


def build(size_mib: int, device: str, trained: bool) -> tuple[object, object]:
    import torch

    layers = 8
    width = int((size_mib * MIB / 4 / layers) ** 0.5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).to(device)
    opt = torch.optim.Adam(model.parameters())
    if trained:
        model(torch.ones(2, width, device=device)).sum().backward()
        opt.step()
    return model, opt


def rank_main(args: argparse.Namespace) -> None:
    """One side of one measurement; the receiver prints its figures as a JSON line."""
    import torch
    import torch.distributed as dist

    from hpresilience.torch.transfer import receive_state, send_state

    rank = 0 if args.role == "source" else 1
    model, opt = build(args.size_mib, args.device, trained=rank == 0)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3  # weights and 2 moments
    store = dist.FileStore(args.store, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))
    flat = torch.ones(nbytes, dtype=torch.uint8)  # touched: the wire's figure counts no first-touch page faults
    dist.barrier()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    if args.mode == "wire":
        (dist.send if rank == 0 else dist.recv)(flat, 1 - rank)
    elif args.mode == "pickled":
        box: list[object] = [{"model": model.state_dict(), "optimizer": opt.state_dict()} if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        if rank == 1:
            model.load_state_dict(box[0]["model"])  # type: ignore[index]
            opt.load_state_dict(box[0]["optimizer"])  # type: ignore[index]
    elif rank == 0:
        send_state(model, opt, 1, 1, None)
    else:
        receive_state(model, opt, 0, None)
    if args.device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    dist.barrier()
    if rank == 1:
        figures = {"mode": args.mode, "s": seconds, "grew": grew, "bytes": nbytes}
        if args.device == "cuda":
            pinned = flat.pin_memory()
            dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            times = []
            for _ in range(3):
                torch.cuda.synchronize()
                t = time.perf_counter()
                dev.copy_(pinned, non_blocking=True)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            figures["h2d_s"] = min(times)
        print(json.dumps(figures), flush=True)
    dist.destroy_process_group()


def measure(args: argparse.Namespace, mode: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="hpr-xfer-") as d:
        common = [sys.executable, __file__, "--size-mib", str(args.size_mib), "--device", args.device]
        common += ["--mode", mode, "--store", str(Path(d) / "store")]
        src = subprocess.Popen([*common, "--role", "source"], stdout=subprocess.DEVNULL)
        out = subprocess.run([*common, "--role", "receiver"], capture_output=True, text=True, timeout=900, check=True)
        src.wait(timeout=60)
    last: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return last


def spread(values: list[float], fmt: str) -> str:
    return f"median {format(statistics.median(values), fmt)} (runs: {', '.join(format(v, fmt) for v in values)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=256, help="parameters; Adam's moments make the state 3x")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--role", choices=["source", "receiver"], help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=["tensor", "pickled", "wire"], help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        rank_main(args)
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("no CUDA GPU: nothing to measure")
            return 3
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in ("wire", "tensor", "pickled")}
    for i in range(args.repeat):
        for mode, got in runs.items():
            got.append(measure(args, mode))
            print(f"  run {i + 1}/{args.repeat} {mode}: {got[-1]['s']:.3f} s", file=sys.stderr, flush=True)
    gib = runs["tensor"][0]["bytes"] / (1 << 30)
    print(f"state: {gib:.2f} GiB (parameters and Adam's two moments), {args.device}, gloo over loopback")
    wire = [r["s"] for r in runs["wire"]]
    print(f"[wire] one flat send of the same bytes: {spread(wire, '.3f')} s")
    for mode in ("tensor", "pickled"):
        s = [r["s"] for r in runs[mode]]
        ratio = [w / x for w, x in zip(wire, s, strict=True)]
        grew = [r["grew"] / (1 << 30) for r in runs[mode]]
        print(
            f"[{mode}] {spread(s, '.3f')} s; speed against the wire {spread(ratio, '.0%')}; "
            f"receiver's peak memory grew {spread(grew, '.2f')} GiB"
        )
    t, p = statistics.median(r["s"] for r in runs["tensor"]), statistics.median(r["s"] for r in runs["pickled"])
    print(f"tensor by tensor is {p / t:.1f}x faster than the pickled object")
    if args.device == "cuda":
        h2d = [r["h2d_s"] for r in runs["tensor"]]
        ratio = [h / r["s"] for h, r in zip(h2d, runs["tensor"], strict=True)]
        print(
            f"[gpu] pinned host-to-device copy of the same bytes {spread(h2d, '.3f')} s; the transfer into GPU "
            f"tensors runs at {spread(ratio, '.0%')} of it (goal >= 70 %; the loopback wire bounds it)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
