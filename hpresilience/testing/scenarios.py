"""`hpresilience demo --scenario sdc|nan`: wrong-not-dead faults on the local cluster, each ending in one line.

sdc: a fault-free reference run (under the wrapper, 2 nodes x 2 ranks), then the same run with one spare in
which local rank 1 of the second node flips a bit of its weights at step FLIP_STEP in every attempt there (a bad
device reproduces its fault). The replica check (every CHECK_EVERY steps) names the rank and node, the wrapper
relaunches on the same nodes, the node is named again and marked Action:Replace, the spare takes its place,
and the run ends with the reference's weights:
    scenario sdc: ok node=N rank=R detected_after_steps=K weights_equal=yes
nan: step NAN_STEP's loss is NaN; loss_policy rollback relaunches from the checkpoint before it and skips the
steps that produced it:
    scenario nan: ok rolled_back_to=S skipped=A-B completed=yes
`FAILED` with the same fields otherwise. The training script is examples/train_checked.py.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hpresilience
from hpresilience.errors import JobFailed
from hpresilience.goodput.ledgerfile import read_events
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster

REPO = Path(hpresilience.__file__).resolve().parent.parent
STEPS = 40
CHECK_EVERY = 10
FLIP_STEP = 23
NAN_STEP = 23
SKIP = 2


@dataclass
class Job:
    """One submitted job of a scenario: its id and where its output and the wrapper's events go."""

    work: Path
    name: str
    job_id: int = 0

    @property
    def out(self) -> str:
        p = self.work / f"{self.name}.out"
        return p.read_text(errors="replace") if p.exists() else ""

    @property
    def err(self) -> str:
        p = self.work / f"{self.name}.err"
        return p.read_text(errors="replace") if p.exists() else ""

    def events(self, name: str) -> list[dict[str, Any]]:
        p = self.work / self.name / f"{self.job_id}.events.jsonl"
        return [e for e in (read_events(p) if p.exists() else []) if e.get("event") == name]


class Scenario:
    def __init__(self, cl: DevCluster, work: Path, say: Callable[[str], None], timeout: float) -> None:
        self.cl, self.work, self.say, self.timeout = cl, work, say, timeout
        self.client: SlurmClient = cl.client()
        self.env = {**cl.env(), "PYTHONUNBUFFERED": "1"}
        self.python = sys.executable
        self.jobs: list[Job] = []
        work.mkdir(parents=True, exist_ok=True)

    def submit(self, name: str, nodes: list[str], config: str, train_args: str, spares: int = 0) -> Job:
        job = Job(self.work, name)
        state = self.work / name
        state.mkdir(exist_ok=True)
        (self.work / f"{name}.yaml").write_text(config)
        bindir = os.path.dirname(self.python)
        script = self.work / f"{name}.sbatch"
        script.write_text(
            "#!/bin/bash\n"
            f"export PATH={shlex.quote(str(REPO / 'slurm'))}:{shlex.quote(bindir)}:$PATH  # the srun shim first\n"
            f"export HPR_CKPT_DIR={shlex.quote(str(self.work / (name + '-ckpt')))}\n"
            f"export HPRESILIENCE_CONFIG={shlex.quote(str(self.work / (name + '.yaml')))}\n"
            f"srun --auto-resume=1 --auto-resume-spares={spares} --auto-resume-state-dir={shlex.quote(str(state))} "
            f"-N{len(nodes) - spares} --ntasks-per-node=2 --overcommit {shlex.quote(self.python)} "
            f"{shlex.quote(str(REPO / 'examples' / 'train_checked.py'))} --steps {STEPS} --ckpt-every 5 "
            f"--check-every {CHECK_EVERY} --sleep 0.05 {train_args}\n"
        )
        job.job_id = self.client.sbatch(
            f"-N{len(nodes)}",
            f"--nodelist={','.join(nodes)}",
            "--ntasks-per-node=2",
            "--overcommit",  # the devcluster's nodes have one CPU each; two ranks share it
            "--no-kill",
            f"--job-name=hpr-{name}",
            f"--output={self.work / (name + '.out')}",
            f"--error={self.work / (name + '.err')}",
            str(script),
            env=self.env,
        )
        self.jobs.append(job)
        self.say(f"submitted {name}: job {job.job_id} on {','.join(nodes)}")
        return job

    def finish(self, job: Job) -> str:
        """Wait for the job to end; its final state."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            j = self.client.job(job.job_id)
            if j.is_finished:
                self.say(f"job {job.job_id} ({job.name}) ended {j.state}")
                return j.state
            time.sleep(0.5)
        self.client.cancel(job.job_id)
        raise JobFailed(f"job {job.job_id} ({job.name}) did not end within {self.timeout:g} s; see {self.work}")


def weights(out: str) -> str | None:
    m = re.findall(r"training finished step=\d+ weights=(\w+)", out)
    return m[-1] if m else None


BASE_CONFIG = "autoresume:\n  heartbeat_every_s: 1\n  hang_floor_s: 120\n"


def run_sdc(sc: Scenario) -> tuple[bool, str]:
    nodes = sc.cl.names()[:3]
    victim = nodes[1]  # not the batch host (the first): a marked batch host would end the batch script
    config = BASE_CONFIG + "  replica_mark_after: 2\n"
    ref = sc.submit("sdc-reference", nodes[:2], config, "")
    ref_state = sc.finish(ref)
    job = sc.submit("sdc", nodes, config, f"--flip-node {victim} --flip-step {FLIP_STEP}", spares=1)
    state = sc.finish(job)
    named = job.events("replica_disagreement")
    marked = job.events("sdc_node_marked")
    first = named[0] if named else {}
    node, rank = first.get("node", "-"), first.get("rank", "-")
    after = int(first["step"]) - FLIP_STEP if "step" in first else -1
    reason = sc.client.node(victim).reason
    equal = weights(ref.out) is not None and weights(ref.out) == weights(job.out)
    ok = (
        ref_state == "COMPLETED"
        and state == "COMPLETED"
        and node == victim
        and 0 <= after <= CHECK_EVERY
        and bool(marked)
        and "Action:Replace" in reason
        and equal
        and not any(ref.events(e) for e in ("replica_disagreement", "integrity_rollback", "integrity_stop"))
    )
    for e in named:
        sc.say(f"wrapper: replica_disagreement rank={e.get('rank')} node={e.get('node')} step={e.get('step')}")
    sc.say(f"slurm: {victim} reason={reason!r}")
    line = f"node={node} rank={rank} detected_after_steps={after} weights_equal={'yes' if equal else 'no'}"
    return ok, line


def run_nan(sc: Scenario) -> tuple[bool, str]:
    nodes = sc.cl.names()[:2]
    config = BASE_CONFIG + f"  loss_policy: rollback\n  loss_skip_steps: {SKIP}\n"
    job = sc.submit("nan", nodes, config, f"--nan-step {NAN_STEP}")
    state = sc.finish(job)
    rolled = job.events("integrity_rollback")
    resumed = [int(s) for s in re.findall(r"resumed from step=(\d+)", job.out)]
    skipped = rolled[0].get("skip", "-") if rolled else "-"
    completed = state == "COMPLETED" and weights(job.out) is not None
    back = resumed[0] if resumed else -1
    ok = completed and len(rolled) == 1 and 0 <= back < NAN_STEP and skipped == f"{NAN_STEP - SKIP + 1}-{NAN_STEP}"
    for e in rolled:
        sc.say(f"wrapper: integrity_rollback {e.get('why')} restore_max_step={e.get('restore_max_step')}")
    return ok, f"rolled_back_to={back} skipped={skipped} completed={'yes' if completed else 'no'}"


def run_crash_loop(sc: Scenario) -> tuple[bool, str]:
    from hpresilience.testing.crashdemo import run_crash_loop as run  # its own module: the job and its checks

    sc.work.mkdir(parents=True, exist_ok=True)
    return run(sc.cl, sc.work, sc.say, sc.timeout)


def run_checkpointless(sc: Scenario) -> tuple[bool, str]:
    from hpresilience.testing.checkpointless import run_checkpointless as run  # three jobs of its own

    sc.work.mkdir(parents=True, exist_ok=True)
    return run(sc.cl, sc.work, sc.say, sc.timeout)


SCENARIOS: dict[str, Callable[[Scenario], tuple[bool, str]]] = {
    "sdc": run_sdc,
    "nan": run_nan,
    "crash-loop": run_crash_loop,
    "checkpointless": run_checkpointless,
}


def run_scenario(name: str, sc: Scenario) -> tuple[bool, str]:
    """Run one scenario; (ok, its one line)."""
    ok, fields = SCENARIOS[name](sc)
    return ok, f"scenario {name}: {'ok' if ok else 'FAILED'} {fields}"
