"""Sections [6] and [7] of bench_checkpoint.py: a 2-rank checkpoint restored on more ranks, memory tiers
vs S3: [6] on 4 ranks, 2 per node; [7] on 8 ranks on one node (the usual 8 GPUs per node).

Spawned gloo ranks on this machine, one memory-tier folder per simulated node shared by that node's
ranks (rank r of a job with `rpn` ranks per node uses `node{r // rpn}`), a local moto S3 server over
HTTP. Each figure is the slowest rank's load() time after a barrier.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hpresilience.log import setup_logging
from hpresilience.torch import CheckpointConfig, TieredCheckpointer

GIB = 1 << 30


def _state(total_gib: float, saved: int, rank: int) -> dict[str, torch.Tensor]:
    """Each of the `saved` ranks owns 4 private tensors."""
    n = int(total_gib * GIB) // 4 // (saved * 4)
    return {f"r{rank}.p{i}": torch.full((n,), float(rank * 10 + i)) for i in range(4)}


def _target(total_gib: float, saved: int, rank: int, world: int) -> dict[str, torch.Tensor]:
    """What new rank `rank` of `world` asks for: an equal share of the saved tensors, in order (as a new
    shard layout would); with world=1 everything."""
    n = int(total_gib * GIB) // 4 // (saved * 4)
    keys = [f"r{r}.p{i}" for r in range(saved) for i in range(4)]
    share = len(keys) // world
    return {k: torch.empty(n) for k in keys[rank * share : (rank + 1) * share]}


def _rank(rank: int, world: int, port: int, work: str, task: str, kw: dict[str, Any]) -> None:
    torch.set_num_threads(1)  # many ranks on few cores
    warnings.filterwarnings("ignore")
    setup_logging("error", json=True)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=600),
    )
    cfg = CheckpointConfig(
        namespace="reshard",
        memory_dir=str(Path(work) / f"node{rank // kw['rpn']}"),
        ranks_per_node=kw["rpn"],
        keep=1,
        s3_base="s3://bench/reshard",
        s3_every=1,
        s3_endpoint_url=kw["url"],
    )
    ck = TieredCheckpointer(cfg)
    if task == "save":
        ck.save(_state(kw["gib"], world, rank), 1)
        ck.flush()
    else:
        target = _target(kw["gib"], kw["saved"], rank, world)
        dist.barrier()
        t0 = time.perf_counter()
        step = ck.load(target)
        took = time.perf_counter() - t0
        ok = step == 1 and all(
            bool((t == float(int(k[1 : k.index(".")]) * 10 + int(k[-1]))).all()) for k, t in target.items()
        )
        (Path(work) / f"{task}_{rank}.json").write_text(json.dumps({"s": took, "ok": ok, "source": ck.last_source}))
    ck.close(keep_tier=True)  # the next phase loads from these tiers
    dist.destroy_process_group()


def _run(world: int, work: Path, task: str, **kw: Any) -> list[dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(world, port, str(work), task, kw), nprocs=world, start_method="spawn", join=True)
    if task == "save":
        return []
    return [json.loads((work / f"{task}_{r}.json").read_text()) for r in range(world)]


def reshard_figures(gib: float, work_root: Path) -> None:
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "x")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "x")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    url = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=url).create_bucket(Bucket="bench")
    try:
        for label, world, rpn in (("[6]", 4, 2), ("[7]", 8, 8)):
            work = work_root / f"reshard{world}"
            work.mkdir()
            _run(2, work, "save", url=url, gib=gib, rpn=1)
            mem = _run(world, work, "load_mem", url=url, gib=gib, saved=2, rpn=rpn)
            for d in work.glob("node*"):
                shutil.rmtree(d)
            s3 = _run(world, work, "load_s3", url=url, gib=gib, saved=2, rpn=rpn)
            assert all(r["ok"] for r in mem + s3), (mem, s3)
            t_mem, t_s3 = max(r["s"] for r in mem), max(r["s"] for r in s3)
            print(
                f"{label} {gib:.2f} GiB saved on 2 ranks (2 nodes), restored on {world} ranks, {rpn} per node, "
                f"each loading 1/{world}: from memory tiers {t_mem:.2f} s | from S3 (moto, localhost) "
                f"{t_s3:.2f} s | memory is {t_s3 / t_mem:.1f}x faster (goal >= 5x)"
            )
            shutil.rmtree(work, ignore_errors=True)
    finally:
        srv.stop()
