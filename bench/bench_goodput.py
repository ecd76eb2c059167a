"""Measured badput per fault, by category, on a real local devcluster (the goodput model's inputs).

Each scenario runs `srun --auto-resume=1` with the stand-in trainer (tests/autoresume/data/trainer.sh: a
checkpoint every step, no framework start-up, so reinit and lost work here are the floor; a torch job adds
its own start-up to reinit), injects one fault once the trainer is at step 3, lets the relaunched attempt
make progress, cancels the job and reads the fault's restart entry from the job's ledger:

1. hot spare: Action:Replace on a node of a 2-node step with 1 spare in the allocation;
2. grow: no spare, the job shrinks and grows into an idle node;
3. requeue: no spare and no idle node: the wrapper requeues, the controller releases the job at once;
4. node death: slurmd and every process of a node killed (no mark in Slurm): the step dies, the wrapper's
   liveness probe blames the node, the job grows into an idle node.

    .venv/bin/python bench/bench_goodput.py [--base-port 21917] [--timeout 300]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_restart import (
    events,
    fail_non_batch_node,
    settle,
    submit,
    text,
    wait_for,
    wrapper,
)

from hpresilience.controller.loop import Controller
from hpresilience.controller.settings import ControllerSettings
from hpresilience.goodput.ledger import (
    Badput,
    compute,
)
from hpresilience.goodput.ledgerfile import read_events
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster

AFTER_RELAUNCH_S = 3.0


def progressed(work: Path, job: int, attempt: int) -> bool:
    return any(e["attempt"] == attempt for e in events(work, job, "attempt_progress"))


def restart_entry(slurm: SlurmClient, work: Path, job: int, timeout: float) -> dict[str, Any]:
    """Let the relaunched attempt progress, cancel the job, and read the fault's restart from its ledger."""
    wait_for(lambda: progressed(work, job, 2), "the relaunched attempt's progress", timeout)
    time.sleep(AFTER_RELAUNCH_S)
    slurm.cancel(job)
    ledger = compute(job, read_events(work / "state" / f"{job}.events.jsonl"), now=time.time())
    if len(ledger.restarts) != 1:
        raise SystemExit(f"job {job}: expected one restart, ledger has {len(ledger.restarts)}")
    return ledger.restarts[0].to_dict()


def hot_spare(cl: DevCluster, slurm: SlurmClient, work: Path, timeout: float) -> dict[str, Any]:
    job = submit(cl, slurm, work, 3, wrapper(work, "--auto-resume-spares=1"), "--no-kill")
    wait_for(lambda: "step=3 " in text(work / "out"), "step 3", timeout)
    fail_non_batch_node(slurm, job)
    return restart_entry(slurm, work, job, timeout)


def grow(cl: DevCluster, slurm: SlurmClient, work: Path, timeout: float) -> dict[str, Any]:
    job = submit(cl, slurm, work, 2, wrapper(work, ""), "--no-kill")
    wait_for(lambda: "step=3 " in text(work / "out"), "step 3", timeout)
    fail_non_batch_node(slurm, job)
    return restart_entry(slurm, work, job, timeout)


def node_death(cl: DevCluster, slurm: SlurmClient, work: Path, timeout: float) -> dict[str, Any]:
    job = submit(cl, slurm, work, 2, wrapper(work, ""), "--no-kill")
    wait_for(lambda: "step=3 " in text(work / "out"), "step 3", timeout)
    j = slurm.job(job)
    victim = next(n for n in j.nodes if n != j.batch_host)
    root = psutil.Process(cl.daemon_pids()[victim])
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            p.kill()
    try:
        return restart_entry(slurm, work, job, timeout)
    finally:
        cl.start_node(victim)


def requeue(cl: DevCluster, slurm: SlurmClient, work: Path, timeout: float) -> dict[str, Any]:
    provider = work / "provider.sh"
    provider.write_text(
        f"#!/bin/sh\nexec '{sys.executable}' -m hpresilience devcluster restart-node \"$1\" "
        f"--state-dir '{cl.state_dir}'\n"
    )
    provider.chmod(0o755)
    settings = ControllerSettings.model_validate(
        {
            "poll_interval_s": 1.0,
            "state_dir": str(work / "ctl"),
            "forced_down_after_s": 60,
            "metrics_address": "",
            "default_provider": "script",
            "default_options": {"command": [str(provider)], "timeout_s": 60},
            "gate": {"kind": "none"},
            "release_requeued_every_s": 1.0,
        }
    )
    ctl = Controller(settings, slurm)
    thread = threading.Thread(target=ctl.run, daemon=True)
    thread.start()
    blocker = slurm.sbatch("--nodes=2", "--output=/dev/null", "--wrap", "sleep 600")  # nothing idle anywhere
    slurm.wait_running(blocker)
    try:
        job = submit(cl, slurm, work, 2, wrapper(work, "--auto-resume-replace-timeout=1"), "--no-kill")
        wait_for(lambda: "step=3 " in text(work / "out"), "step 3", timeout)
        fail_non_batch_node(slurm, job)
        return restart_entry(slurm, work, job, timeout)
    finally:
        slurm.cancel(blocker)
        ctl.stop()
        thread.join(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-port", type=int, default=21917)
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    scenarios = (("hot spare", hot_spare), ("grow", grow), ("requeue", requeue), ("node death", node_death))
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="hpr-bench-goodput-") as tmp:
        cl = DevCluster(Path(tmp) / "cluster", nodes=4, base_port=args.base_port, overrides={"SlurmdTimeout": "5"})
        cl.up(timeout=60)
        try:
            slurm = cl.client()
            for name, fn in scenarios:
                work = Path(tmp) / name.replace(" ", "_")
                work.mkdir()
                print(f"running: {name}", file=sys.stderr, flush=True)
                results[name] = fn(cl, slurm, work, args.timeout)
                settle(slurm)
        finally:
            cl.down()
    cats = [b.value for b in Badput if b not in (Badput.CHECKPOINT, Badput.RESTORE)]
    print("badput per fault by category, seconds (stand-in trainer, same devcluster, same run):")
    print(f"  {'fault':<11}" + "".join(f"{c:>12}" for c in cats) + f"{'total':>9}")
    for name, r in results.items():
        row = "".join(f"{r['by_category'].get(c, 0.0):12.2f}" for c in cats)
        print(f"  {name:<11}{row}{r['badput_s']:9.2f}")
    print("  (checkpoint, restore: not reported by the stand-in trainer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
