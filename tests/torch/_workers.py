"""Rank bodies for the multi-process tests (started by a forkserver, so they live in an importable module).

The ranks are forked from a server process that imported this module, and with it torch, once per pytest process:
a spawned rank imports torch itself (about 1.4 s of CPU each, some 110 ranks a run on CI's 2 cores). A forked rank
takes the environment and working directory the server started with, so each rank is handed the test's own (a
test's monkeypatched credentials or endpoint reach its ranks as they did when spawned)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from hpresilience.torch import CheckpointConfig, TieredCheckpointer


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.torch._workers"])  # read when the server starts (the first rank)
    return ctx


def _in_test_env(env: dict[str, str], cwd: str, body: Any, args: tuple[Any, ...]) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    body(*args)


def _rank(body: Any, *args: Any) -> Any:
    """A process that runs `body(*args)` in this process's environment and working directory."""
    return _context().Process(target=_in_test_env, args=(dict(os.environ), os.getcwd(), body, args))


def state_for(step: int, rank: int, *, numel: int = 1000) -> dict[str, Any]:
    """A replicated part (same on every rank, like DDP weights) and a rank-private part (like FSDP shards)."""
    g = torch.Generator().manual_seed(step)
    return {
        "shared": {"w": torch.randn(numel, generator=g), "b": torch.arange(7, dtype=torch.int64) * step},
        f"local_{rank}": torch.full((3, 5), float(step * 10 + rank)),
        "meta": {"step": step, "note": f"s{step}"},
    }


def empty_state(rank: int, *, numel: int = 1000) -> dict[str, Any]:
    z = state_for(0, rank, numel=numel)
    z["shared"]["w"].zero_()
    z[f"local_{rank}"].fill_(-1)
    z["meta"] = {"step": -1, "note": ""}
    return z


def matches(state: dict[str, Any], step: int, rank: int) -> bool:
    want = state_for(step, rank, numel=state["shared"]["w"].numel())
    return (
        torch.equal(state["shared"]["w"], want["shared"]["w"])
        and torch.equal(state["shared"]["b"], want["shared"]["b"])
        and torch.equal(state[f"local_{rank}"], want[f"local_{rank}"])
        and state["meta"] == want["meta"]
    )


def rendezvous_file(base: Path) -> str:
    """Where one process group's ranks meet: a file of its own (a FileStore), not a TCP port picked in advance,
    which another process of the machine could take before rank 0 listens on it (EADDRINUSE under CI's load)."""
    return str(base / f"rendezvous-{uuid.uuid4().hex}")


def _init(rank: int, world: int, rendezvous: str, timeout_s: float) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def _cfg(rank: int, base: Path, rpn: int, extra: dict[str, Any]) -> CheckpointConfig:
    return CheckpointConfig(
        namespace="job1",
        memory_dir=str(base / f"node{rank // rpn}"),
        ranks_per_node=rpn,
        timeout_s=extra.pop("timeout_s", 30.0),
        **extra,
    )


def _body(rank: int, world: int, rendezvous: str, base: str, task: str, kw: dict[str, Any]) -> None:
    out = Path(base) / f"result_{task}_{rank}.json"
    try:
        _init(rank, world, rendezvous, 30.0)
        rpn = kw.pop("rpn", 1)
        ckpt = TieredCheckpointer(_cfg(rank, Path(base), rpn, dict(kw.pop("cfg", {}))))
        res: dict[str, Any] = {}
        if task == "save":
            crash_step = kw.get("crash_step")
            for step in kw["steps"]:
                if step == crash_step and rank == kw.get("crash_rank", 1):
                    ckpt.fault_hook = lambda _r: os._exit(9)
                state = state_for(step, rank)
                if step == kw.get("stale_step") and rank == kw.get("stale_rank", 1):
                    # A stale asynchronous save (staleness.py): the tensors of the step before, under this step.
                    state = {**state_for(step - 1, rank), "meta": state["meta"]}
                fut = ckpt.async_save(state, step)
                if step == crash_step:
                    try:
                        fut.result()
                        res["crash_save"] = "succeeded"
                    except Exception as err:  # noqa: BLE001 - the test records what happened
                        res["crash_save"] = f"failed: {type(err).__name__}"
                    out.write_text(json.dumps(res))
                    os._exit(0)  # the job is dead: no orderly shutdown with a missing rank
            ckpt.flush()
            res["last_committed"] = ckpt.last_committed
            res["stale"] = [f.step for f in ckpt.failures if f.stage.value == "stale"]
        elif task == "post_commit_failure":
            _post_commit_failure(rank, ckpt, res)
            if rank == 1:
                out.write_text(json.dumps(res))
                os._exit(0)  # gone without a goodbye: rank 0 must still get out of flush() and close()
            t0 = time.monotonic()
            res["third_save_ok"] = ckpt.async_save(state_for(3, rank), 3) is not None and ckpt.wait()
            res["flush_dead_peer"] = ckpt.flush(timeout=3.0)
            res["close_ok"] = ckpt.close(keep_tier=True, timeout=3.0)
            res["dead_peer_s"] = time.monotonic() - t0
            out.write_text(json.dumps(res))
            os._exit(0)
        elif task == "load":
            state = empty_state(rank)
            step = ckpt.load(state, kw.get("step"))
            res["step"] = step
            res["source"] = ckpt.last_source
            res["match"] = step is not None and matches(state, step, rank)
        elif task == "load_part":
            # Each new rank asks for one saved rank's private part (like a new shard layout).
            mine = rank % kw["saved_world"]
            state = empty_state(mine)
            step = ckpt.load(state, kw.get("step"))
            res["step"] = step
            res["match"] = step is not None and matches(state, step, mine)
        elif task == "load_resharded":
            # Every rank asks for every saved rank's private part: the union of the saved state.
            saved = kw["saved_world"]
            state = empty_state(0)
            for r in range(1, saved):
                state[f"local_{r}"] = torch.full((3, 5), -1.0)
            step = ckpt.load(state, kw.get("step"))
            res["step"] = step
            res["source"] = ckpt.last_source
            res["match"] = step is not None and all(matches(state, step, r) for r in range(saved))
            res["restore_left"] = (Path(ckpt.tier.base) / ".restore").exists() and any(
                (Path(ckpt.tier.base) / ".restore").iterdir()
            )
        ckpt.close(keep_tier=True)
        dist.destroy_process_group()
        out.write_text(json.dumps(res))
    except BaseException:  # noqa: BLE001 - reported to the parent through the result file
        out.write_text(json.dumps({"error": traceback.format_exc()}))
        sys.exit(1)


def _post_commit_failure(rank: int, ckpt: TieredCheckpointer, res: dict[str, Any]) -> None:
    """Issue 22 item 3: rank 1 cannot write the markers of a step saved through dcp.save with the
    checkpointer's writer (a folder sits where `.metadata` goes); every rank's flush() must return and
    say so, and the next save must go through."""
    planted = ckpt.tier.step_dir(1) / ".metadata"
    if rank == 1:
        (planted / "x").mkdir(parents=True)
    dcp_save(state_for(1, rank), storage_writer=ckpt.storage_writer(1))
    t0 = time.monotonic()
    res["flush1"] = ckpt.flush(timeout=30.0)
    res["flush1_s"] = time.monotonic() - t0
    res["stages"] = sorted({f.stage.value for f in ckpt.failures})
    if rank == 1:
        shutil.rmtree(planted)
    dist.barrier()
    dcp_save(state_for(2, rank), storage_writer=ckpt.storage_writer(2))
    res["flush2"] = ckpt.flush(timeout=30.0)
    res["committed"] = ckpt.stats.committed
    res["last_committed"] = ckpt.last_committed
    dist.barrier()


def start_and_join(procs: list[Any], timeout: float) -> None:
    """Start the rank processes and wait for each (killed past `timeout`: a hung rank fails the test, not CI)."""
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()


def run_ranks(base: Path, task: str, world: int = 2, timeout: float = 60.0, **kw: Any) -> list[dict[str, Any]]:
    """Run `task` on `world` rank processes; return each rank's result (or its error)."""
    rendezvous = rendezvous_file(base)
    for r in range(world):
        (base / f"result_{task}_{r}.json").unlink(missing_ok=True)
    procs = [_rank(_body, r, world, rendezvous, str(base), task, dict(kw)) for r in range(world)]
    start_and_join(procs, timeout)
    results = []
    for r in range(world):
        f = base / f"result_{task}_{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else {"exitcode": procs[r].exitcode})
    return results


def _phase(rank: int, base: Path, ph: dict[str, Any]) -> dict[str, Any]:
    """One phase of a scenario on this rank: save, or load (same world or resharded)."""
    world, rpn, numel = ph["world"], ph["rpn"], ph.get("numel", 1000)
    if rank == 0:  # before the rendezvous, which no other rank passes without rank 0
        for node in ph.get("drop", []):
            shutil.rmtree(base / node / ph["ns"], ignore_errors=True)
    _init(rank, world, ph["rendezvous"], 60.0)
    try:
        cfg = CheckpointConfig(
            namespace=ph["ns"],
            memory_dir=str(base / f"node{rank // rpn}"),
            ranks_per_node=rpn,
            timeout_s=60.0,
            **ph.get("cfg", {}),
        )
        ckpt = TieredCheckpointer(cfg)
        res: dict[str, Any] = {}
        if ph["task"] == "save":
            for step in ph["steps"]:
                ckpt.async_save(state_for(step, rank, numel=numel), step)
            res["flushed"] = ckpt.flush()
            res["last_committed"] = ckpt.last_committed
            res["steps_on_node"] = ckpt.tier.steps()
            res["spare"] = ckpt.tier.spare(rank).is_file()
        else:
            saved = ph["saved_world"]
            # Same world: each rank asks for its own part; resharded: for the union of the saved parts.
            parts = [rank] if saved == world else list(range(saved))
            state = empty_state(parts[0], numel=numel)
            for r in parts[1:]:
                state[f"local_{r}"] = torch.full((3, 5), -1.0)
            step = ckpt.load(state)
            res["step"] = step
            res["source"] = ckpt.last_source
            res["match"] = step is not None and all(matches(state, step, r) for r in parts)
        res["closed"] = ckpt.close(keep_tier=ph.get("keep_tier", True))
        return res
    finally:
        dist.destroy_process_group()


def _scenario_body(rank: int, base: str, phases: list[dict[str, Any]]) -> None:
    out = Path(base) / f"result_scenario_{rank}.json"
    results: list[Any] = []
    try:
        for ph in phases:
            results.append(_phase(rank, Path(base), dict(ph)) if rank < ph["world"] else None)
        out.write_text(json.dumps(results))
    except BaseException:  # noqa: BLE001 - reported to the parent through the result file
        out.write_text(json.dumps({"error": traceback.format_exc(), "done": results}))
        sys.exit(1)


def run_scenario(base: Path, phases: list[dict[str, Any]], timeout: float = 240.0) -> list[Any]:
    """Run `phases` one after another on one set of rank processes (set up once per scenario, which matters
    on 2 cores): a phase of world size W runs on processes 0..W-1, the others
    skip it. Each phase has its own rendezvous file. Returns each process's list of phase results."""
    procs_n = max(ph["world"] for ph in phases)
    phases = [{**ph, "rendezvous": rendezvous_file(base)} for ph in phases]
    for r in range(procs_n):
        (base / f"result_scenario_{r}.json").unlink(missing_ok=True)
    procs = [_rank(_scenario_body, r, str(base), phases) for r in range(procs_n)]
    start_and_join(procs, timeout)
    results = []
    for r in range(procs_n):
        f = base / f"result_scenario_{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else {"exitcode": procs[r].exitcode})
    return results
