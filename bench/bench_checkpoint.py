#!/usr/bin/env python3
"""Tiered checkpoint figures, each a ratio against a baseline measured in the same run on the same state.

  1. blocking time of TieredCheckpointer.async_save (memory tier) vs a synchronous DCP FileSystemWriter
     save of the same state into the same tmpfs (goal <= 10 %) and vs the inline copy itself (a memcpy
     of the state into the warm staging buffer): the default (the whole copy inside the call) and
     background staging (large tensors copied until the next forward or optimizer.step, which wait);
  2. memory-tier write throughput (TierStorageWriter, checksums included) vs a plain memcpy of the same
     bytes, into fresh pages and into warm pages (goal >= 50 %);
  3. restore time from the memory tier vs from S3 (a local moto server over HTTP; goal >= 5x faster);
  4. restore speed: TieredCheckpointer.load into fresh and into warm target tensors vs a memcpy of the
     same bytes into the same kind of pages, each run's load beside its own memcpy (--restore-runs, 5:
     min/median/max of the ratios; goal >= 70 % for warm pages, the median), on the --dir tmpfs as it is
     mounted, then on a tmpfs with huge pages (huge=within_size, as the compute install sets /dev/shm; root only);
  5. a 60 s save cadence on this state: blocking per save, call to COMMIT marker, and the peer-copy
     traffic per node that competes with the training collectives;
  6. a checkpoint saved by 2 ranks restored onto 4 ranks (2 per node), each loading a quarter
     (resharded): from the memory tiers vs from S3 (goal >= 5x);
  7. the same restored onto 8 ranks on one node (8 per node, as with 8 GPUs), each loading an eighth
     (spawned gloo ranks, one memory-tier folder per simulated node shared by its ranks; --reshard-gib of
     state in all).

Sections 1-5 run in one process with no process group. Usage:
bench/bench_checkpoint.py [--size-gib 1.0] [--reshard-gib 0.25] [--dir /dev/shm] [--no-s3]
                          [--restore-runs 5] [--only-restore]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from hpresilience.log import setup_logging
from hpresilience.torch import CheckpointConfig, MemoryTier, TieredCheckpointer, TierStorageWriter
from hpresilience.torch.layout import DEFAULT_ALGO
from hpresilience.torch.reader import _PIECE, readers
from hpresilience.torch.storage import _pread_into

warnings.filterwarnings("ignore")
GIB = 1 << 30


def make_state(size_gib: float, pieces: int = 16) -> dict[str, torch.Tensor]:
    n = int(size_gib * GIB) // 4 // pieces
    return {f"layer{i}.weight": torch.randn(n) for i in range(pieces)}


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--reshard-gib", type=float, default=0.25)
    ap.add_argument("--restore-runs", type=int, default=5)
    ap.add_argument("--only-restore", action="store_true", help="section 4 only")
    args = ap.parse_args()
    setup_logging("error", json=True)
    work = Path(tempfile.mkdtemp(prefix="hpr-bench-", dir=args.dir))
    state = make_state(args.size_gib)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    print(
        f"state: {nbytes / GIB:.2f} GiB in {len(state)} tensors; tier {work}; checksum {DEFAULT_ALGO}; "
        f"torch threads {torch.get_num_threads()}"
    )
    try:
        if args.only_restore:
            restore_speed(state, work, args.restore_runs)
            restore_on_huge_pages(state, args.restore_runs)
            return 0
        # 1. blocking time: sync FileSystemWriter vs async_save to the memory tier (steady state).
        fs_times = []
        for i in range(args.repeat):
            d = work / f"fs{i}"
            t0 = time.perf_counter()
            dcp_save(state, storage_writer=FileSystemWriter(str(d)))
            fs_times.append(time.perf_counter() - t0)
            shutil.rmtree(d)
        fs = statistics.median(fs_times)
        cache = {k: torch.empty_like(v) for k, v in state.items()}
        copy_t = statistics.median(
            timed(lambda c=cache: [c[k].copy_(v) for k, v in state.items()]) for _ in range(args.repeat + 1)
        )
        del cache
        for background in (False, True):
            cfg = CheckpointConfig(
                namespace="bench", memory_dir=str(work / "tier"), keep=1, background_staging=background
            )
            ck = TieredCheckpointer(cfg)
            blocking, behind = [], []
            for step in range(1, args.repeat + 2):
                t = time.perf_counter()
                fut = ck.async_save(state, step)
                blocking.append(time.perf_counter() - t)
                behind.append(ck.wait_staged())  # what an optimizer.step() right away would wait
                fut.result()
                ck.flush()
            ck.close()
            shutil.rmtree(work / "tier")
            blk = statistics.median(blocking[1:])  # the first call also allocates the staging buffer
            mode = "background staging (opt-in)" if background else "default (inline copy)"
            extra = f", copy done {statistics.median(behind[1:]):.3f} s later" if background else ""
            print(
                f"[1] {mode}: async_save blocking {blk:.3f} s (first call {blocking[0]:.3f} s{extra}) | "
                f"sync FileSystemWriter save {fs:.3f} s: ratio {blk / fs:.1%} (goal <= 10%) | "
                f"inline copy (memcpy into warm buffer) {copy_t:.3f} s: ratio {blk / copy_t:.0%}"
            )

        # 2. write throughput: tier writer (with checksums) vs memcpy, fresh and warm pages.
        tier = MemoryTier(work / "tw", "bench")
        writes = []
        # keep=1 alternates two shard files: steps 1 and 2 write fresh files, later steps recycle them.
        for step in range(1, args.repeat + 3):
            t0 = time.perf_counter()
            dcp_save(state, storage_writer=TierStorageWriter(tier, step, tier_only=True))
            writes.append(time.perf_counter() - t0)
            tier.prune(0, step, keep=1)  # recycles the previous shard file like the checkpointer does
        flat = [t.view(-1) for t in state.values()]
        fresh = []
        dst: list[torch.Tensor] = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            dst = [torch.empty_like(t) for t in flat]
            for a, b in zip(dst, flat, strict=True):
                a.copy_(b)
            fresh.append(time.perf_counter() - t0)
        warm = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            for a, b in zip(dst, flat, strict=True):
                a.copy_(b)
            warm.append(time.perf_counter() - t0)

        def gbs(seconds: float) -> float:
            return nbytes / seconds / 1e9

        w_first, w_steady = statistics.median(writes[:2]), statistics.median(writes[2:])
        f_med, m_med = statistics.median(fresh), statistics.median(warm)
        print(
            f"[2] tier write fresh file {gbs(w_first):.2f} GB/s, "
            f"steady (recycled file) {gbs(w_steady):.2f} GB/s | "
            f"memcpy fresh pages {gbs(f_med):.2f} GB/s, warm {gbs(m_med):.2f} GB/s | "
            f"steady/memcpy-fresh {f_med / w_steady:.0%}, steady/memcpy-warm {m_med / w_steady:.0%} "
            f"(goal >= 50%)"
        )
        dst = []

        # 3. restore: memory tier vs S3 (moto over HTTP on this machine).
        if not args.no_s3:
            restore_figures(state, work)
        restore_speed(state, work, args.restore_runs)
        restore_on_huge_pages(state, args.restore_runs)
        cadence_figures(state, work)
        if not args.no_s3 and args.reshard_gib > 0:
            from bench_reshard import reshard_figures

            reshard_figures(args.reshard_gib, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def kernel_copy(path: Path, target: dict[str, torch.Tensor]) -> None:
    """The floor of any read out of tmpfs: the kernel's copy of the same bytes into the same warm tensors, by as
    many threads as the restore uses, in its pieces, nothing else (no hash, no DCP)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        views, off = [], 0
        for t in target.values():
            views.append((t.numpy().data.cast("B"), off))
            off += t.numel() * t.element_size()

        def one(view: memoryview, at: int) -> None:  # the reader's own read, piece by piece, less its hash
            for i in range(0, len(view), _PIECE):
                _pread_into(fd, view[i : i + _PIECE], at + i, path)

        with ThreadPoolExecutor(readers()) as pool:
            list(pool.map(lambda va: one(*va), views))
    finally:
        os.close(fd)


def restore_speed(state: dict[str, torch.Tensor], work: Path, runs: int) -> None:
    """[4] load() against a memcpy into the same kind of target pages, measured back to back in each run, and
    against the kernel's copy of the same bytes out of tmpfs (what a read from the memory tier cannot beat)."""
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    cfg = CheckpointConfig(namespace="speed", memory_dir=str(work / "rs"), keep=1, replicate=False)
    raw = work / "raw.bin"  # beside the tier, on the same tmpfs
    with open(raw, "wb") as f:
        for v in state.values():
            f.write(v.numpy().tobytes())
    with TieredCheckpointer(cfg) as ck:
        ck.save(state, 1)
        ck.flush()
        ratios: dict[str, list[float]] = {"fresh": [], "warm": []}
        times: dict[str, list[float]] = {"fresh": [], "warm": []}
        floor: list[float] = []
        for _ in range(runs):
            target = {k: torch.empty_like(v) for k, v in state.items()}
            load_fresh = timed(lambda t=target: ck.load(t))
            copy_fresh = timed(lambda: [torch.empty_like(v).copy_(v) for v in state.values()])
            load_warm = timed(lambda t=target: ck.load(t))
            copy_warm = timed(lambda t=target: [t[k].copy_(v) for k, v in state.items()])
            assert all(torch.equal(target[k], state[k]) for k in state)
            floor.append(copy_warm / timed(functools.partial(kernel_copy, raw, target)))
            assert all(torch.equal(target[k], state[k]) for k in state)
            for kind, ld, cp in (("fresh", load_fresh, copy_fresh), ("warm", load_warm, copy_warm)):
                ratios[kind].append(cp / ld)
                times[kind].append(ld)
    raw.unlink()
    parts = []
    for kind in ("fresh", "warm"):
        med, r = statistics.median(times[kind]), ratios[kind]
        parts.append(
            f"{kind} targets {med:.3f} s ({nbytes / med / 1e9:.2f} GB/s) = {statistics.median(r):.0%} of memcpy "
            f"(min {min(r):.0%} / median {statistics.median(r):.0%} / max {max(r):.0%} of {len(r)} runs; "
            f"each: {' '.join(f'{x:.0%}' for x in r)})"
        )
    print(
        f"[4] restore from memory (tier's tmpfs huge={huge_option(work)}; checksums on, {readers()} reader "
        f"threads, torch threads "
        f"{torch.get_num_threads()}): {' | '.join(parts)} (goal: warm median >= 70%) | the kernel's copy alone "
        f"(pread, no hash) into the same warm targets: median {statistics.median(floor):.0%} of memcpy "
        f"(each: {' '.join(f'{x:.0%}' for x in floor)})"
    )


def huge_option(path: Path) -> str:
    """The `huge=` option of the tmpfs that holds `path` (never when absent), from /proc/mounts."""
    best, option = "", "never"
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        mnt = fields[1] if len(fields) > 3 else ""
        inside = str(path) == mnt or str(path).startswith(mnt.rstrip("/") + "/")
        if mnt and inside and len(mnt) > len(best):
            huge = [o.partition("=")[2] for o in fields[3].split(",") if o.startswith("huge=")]
            best, option = mnt, huge[0] if huge else "never"
    return option


def restore_on_huge_pages(state: dict[str, torch.Tensor], runs: int) -> None:
    """[4] again with the tier on a tmpfs with huge pages (huge=within_size, what the installed
    hpresilience-shm-hugepages.service sets on /dev/shm), mounted here for the run; needs root."""
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    mnt = Path(tempfile.mkdtemp(prefix="hpr-bench-huge-"))
    size = f"{(3 * nbytes) // (1 << 20) + 256}m"
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"huge=within_size,size={size},mode=0700", "hpr-bench", str(mnt)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if res.returncode != 0:
        mnt.rmdir()
        print(f"[4] on huge pages: not measured (cannot mount a tmpfs here: {res.stderr.strip()[:200]})")
        return
    try:
        restore_speed(state, mnt, runs)
    finally:
        subprocess.run(["umount", str(mnt)], check=False, timeout=60)
        mnt.rmdir()


def cadence_figures(state: dict[str, torch.Tensor], work: Path, cadence_s: float = 60.0) -> None:
    """[5] What one save costs at a 60 s cadence (default staging, measured on recycled files)."""
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    cfg = CheckpointConfig(namespace="cad", memory_dir=str(work / "cad"), keep=1, replicate=False)
    blocking, commit = [], []
    with TieredCheckpointer(cfg) as ck:
        for step in range(1, 5):
            t0 = time.perf_counter()
            fut = ck.async_save(state, step)
            blocking.append(time.perf_counter() - t0)
            fut.result()  # the coordinator's finish() has written COMMIT when DCP's future completes
            commit.append(time.perf_counter() - t0)
            assert (ck.tier.step_dir(step) / "COMMIT").exists()
            ck.flush()
    blk, cmt = statistics.median(blocking[2:]), statistics.median(commit[2:])
    print(
        f"[5] {cadence_s:.0f} s cadence, {nbytes / GIB:.2f} GiB per rank: blocking per save {blk:.3f} s "
        f"({blk / cadence_s:.2%} of the interval) | call -> COMMIT {cmt:.3f} s | peer-copy traffic "
        f"{nbytes / cadence_s / 1e6:.1f} MB/s per rank sent and received (x ranks per node for a node)"
    )


def restore_figures(state: dict[str, torch.Tensor], work: Path) -> None:
    from moto.server import ThreadedMotoServer

    for k, v in {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(k, v)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    url = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=url).create_bucket(Bucket="bench")
    cfg = {"namespace": "bench", "keep": 1, "s3_base": "s3://bench/r", "s3_every": 1, "s3_endpoint_url": url}
    try:
        with TieredCheckpointer(CheckpointConfig(memory_dir=str(work / "r1"), **cfg)) as ck:  # type: ignore[arg-type]
            ck.save(state, 1)
            up = timed(ck.flush)
            target = {k: torch.empty_like(v) for k, v in state.items()}
            mem = timed(lambda: ck.load(target))
            assert ck.last_source == "own" and all(torch.equal(target[k], state[k]) for k in state)
        target = {k: torch.empty_like(v) for k, v in state.items()}
        with TieredCheckpointer(CheckpointConfig(memory_dir=str(work / "r2"), **cfg)) as ck2:  # type: ignore[arg-type]
            s3 = timed(lambda: ck2.load(target))
            assert ck2.last_source == "s3" and all(torch.equal(target[k], state[k]) for k in state)
        print(
            f"[3] restore from memory {mem:.3f} s | from S3 (moto, localhost) {s3:.3f} s | "
            f"memory is {s3 / mem:.1f}x faster (goal >= 5x); background upload took {up:.2f} s"
        )
    finally:
        srv.stop()


if __name__ == "__main__":
    sys.exit(main())
