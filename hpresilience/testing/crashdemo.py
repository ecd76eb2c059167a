"""`hpresilience demo --scenario crash-loop`: a program that crashes at the same step on every attempt is stopped.

On the local cluster, train_gloo.py runs under `srun --auto-resume=1` with one hot spare and
`retryOnApplicationError: true` (the policy that would relaunch a crashing program for ever), checkpointing every
10 steps, and raises at step 40 on every attempt. The wrapper sees the same crash at the same step twice on the
same nodes, moves the third attempt onto the spare, sees it again and stops (decide/crashloop.py). The scenario
ends with one line: `scenario crash-loop: ok stopped_after=N nodes_marked=0` (`FAILED` with the same fields
when the job did not stop as a crash loop, or a node was marked).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import hpresilience
from hpresilience.errors import EnvironmentMissing
from hpresilience.goodput import ledgerfile
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster

REPO = Path(hpresilience.__file__).resolve().parent.parent
CRASH_AT = 40
BOUND = 3


def submit(cl: DevCluster, client: SlurmClient, work: Path) -> int:
    example = REPO / "examples" / "train_gloo.py"
    if not example.exists():
        raise EnvironmentMissing(f"the example training script is missing: {example}")
    python = sys.executable
    policy = work / "policy.yaml"
    policy.write_text(json.dumps({"runPolicy": {"retryOnApplicationError": True}}))  # JSON is YAML
    config = work / "config.yaml"
    config.write_text(f"autoresume:\n  crash_loop_bound: {BOUND}\n")
    script = work / "crash.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"export PATH={shlex.quote(str(REPO / 'slurm'))}:{shlex.quote(os.path.dirname(python))}:$PATH\n"
        f"export HPR_CKPT_DIR={shlex.quote(str(work / 'ckpt'))}\n"
        f"export HPRESILIENCE_CONFIG={shlex.quote(str(config))}\n"
        f"srun --auto-resume=1 --auto-resume-spares=1 --auto-resume-state-dir={shlex.quote(str(work))} "
        f"--auto-resume-rules={shlex.quote(str(policy))} "
        f"-N2 --ntasks-per-node=1 {shlex.quote(python)} {shlex.quote(str(example))} "
        f"--steps 60 --ckpt-every 10 --sleep 0.05 --crash-at {CRASH_AT}\n"
    )
    return client.sbatch(
        "-N3",
        "--no-kill",
        f"--output={work / 'job.out'}",
        f"--error={work / 'job.err'}",
        str(script),
        env={**cl.env(), "PYTHONUNBUFFERED": "1"},
    )


def read_events(path: Path) -> list[dict[str, Any]]:
    return ledgerfile.read_events(path) if path.exists() else []


SHOWN = ("attempt_started", "crash_repeated", "step_moved_off_crash", "crash_loop_stopped", "job_step_given_up")


def run_crash_loop(cl: DevCluster, work: Path, say: Any, timeout: float) -> tuple[bool, str]:
    """Run the scenario, telling its timeline; (ok, the fields of its one-line verdict)."""
    client = cl.client()
    job_id = submit(cl, client, work)
    say(f"submitted job {job_id}: 3 nodes, -N2 + 1 spare, train_gloo.py raising at step {CRASH_AT} every attempt")
    events_path = work / f"{job_id}.events.jsonl"
    deadline = time.monotonic() + timeout
    shown = 0
    finished = False
    while time.monotonic() < deadline:
        evs = read_events(events_path)
        for e in evs[shown:]:
            if e.get("event") in SHOWN:
                detail = {k: v for k, v in e.items() if k not in ("event", "job_id", "time", "tail", "detail")}
                say(f"wrapper: {e['event']} {detail}")
        shown = len(evs)
        if client.job(job_id).is_finished:
            finished = True
            break
        time.sleep(0.5)
    evs = read_events(events_path)
    stopped = [e for e in evs if e.get("event") == "crash_loop_stopped"]
    marked = {e.get("node") for e in evs if e.get("event") == "suspect_node_marked"}
    marked |= {n.name for n in client.known_nodes(cl.names()) if "hpr-" in n.reason}
    after = stopped[0].get("stopped_after") if stopped else None
    ok = finished and bool(stopped) and after == BOUND and not marked
    if not finished:
        say(f"the job did not end within {timeout:g} s; logs in {work}")
    return ok, f"stopped_after={after if after is not None else '-'} nodes_marked={len(marked)}"
