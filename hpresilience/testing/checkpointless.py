"""`hpresilience demo --scenario checkpointless`: recovery without rollback on the local cluster (issue 33).

examples/checkpointless/train.py (gloo, 2 ranks per node, 2 training nodes + 2 spares, no checkpoint) runs three
times under `srun --auto-resume=1`:

1. in-process mode, no fault: the reference final weights;
2. in-process mode through two faults: an operator's `Action:Replace` on n2 (n3 takes its slot), then n3 dies
   outright (its slurmd and its ranks killed; n4 takes the slot);
3. the relaunch path through an `Action:Replace`, for its fault -> every rank training again figure.

It ends with one line: `scenario checkpointless: ok faults=2 survivors_restarted=0 steps_recomputed=0
max_recovery_s=X restart_path_s=Y weights_equal=yes` (`FAILED` and the same fields when it is not).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import psutil

import hpresilience
from hpresilience.errors import JobFailed
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing import devprocs
from hpresilience.testing.devcluster import DevCluster

REPO = Path(hpresilience.__file__).resolve().parent.parent
TRAIN = REPO / "examples" / "checkpointless" / "train.py"
STEPS = 80


class Job:
    def __init__(self, cl: DevCluster, work: Path, mode: str, spares: int) -> None:
        self.cl, self.work = cl, work
        self.client: SlurmClient = cl.client()
        work.mkdir(parents=True, exist_ok=True)
        config = work / "config.yaml"
        config.write_text("autoresume:\n  full_node_check_s: 0.5\n")  # no controller here: read the nodes
        script = work / "job.sh"
        script.write_text(
            "#!/bin/bash\n"
            f"hpresilience srun --auto-resume=1 --auto-resume-state-dir={work}/state --auto-resume-mode={mode} "
            f"--auto-resume-spares={spares} --auto-resume-poll-interval=0.5 --ntasks-per-node=2 --overcommit "
            f"{sys.executable} {TRAIN}\necho wrapper_rc=$?\n"
        )
        env = cl.env()
        env.update(
            {
                "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
                "TRAIN_STEPS": str(STEPS),
                "STEP_SLEEP": "0.1",
                "HPR_WORLD_WAIT_S": "120",
                "HPRESILIENCE_CONFIG": str(config),
            }
        )
        self.id = self.client.sbatch(
            f"--nodes={2 + spares}", "--no-kill", f"--output={work}/out", f"--error={work}/err", str(script), env=env
        )

    @property
    def out(self) -> str:
        p = self.work / "out"
        return p.read_text(errors="replace") if p.exists() else ""

    def joined(self) -> list[dict[str, str]]:
        return [
            dict(kv.split("=", 1) for kv in ln.split()[2:])
            for ln in self.out.splitlines()
            if ln.startswith("hpr-inprocess joined ")
        ]

    def in_world(self, generation: int) -> list[dict[str, str]]:
        return [j for j in self.joined() if j["generation"] == str(generation)]

    def wait(self, probe: Any, what: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := probe()):
            if time.monotonic() > deadline:
                raise JobFailed(f"job {self.id}: timed out after {timeout:g} s waiting for {what}")
            time.sleep(0.1)
        return value

    def finish(self, timeout: float) -> None:
        self.wait(lambda: "wrapper_rc=" in self.out, "its end", timeout)
        if self.out.split("wrapper_rc=")[-1].strip() != "0":
            raise JobFailed(f"job {self.id} failed: {self.out[-1500:]}")

    def digests(self) -> set[str]:
        return set(re.findall(r"^final rank=\d+ step=\d+ sha256=(\w+)$", self.out, re.MULTILINE))

    def steps(self) -> list[int]:
        return [int(s) for s in re.findall(r"^step=(\d+) ", self.out, re.MULTILINE)]

    def events(self, name: str) -> list[dict[str, Any]]:
        p = self.work / "state" / f"{self.id}.events.jsonl"
        lines = p.read_text().splitlines() if p.exists() else []
        return [e for e in map(json.loads, lines) if e.get("event") == name]

    def cancel(self) -> None:
        with contextlib.suppress(Exception):
            self.client.cancel(self.id)


def die_outright(cl: DevCluster, node: str, job_id: int, stepds: bool = False) -> int:
    """`node` dies outright: its slurmd and the job's tasks there (with `stepds`, their slurmstepds too) are killed
    back to back, then waited for (with its slurmd gone nothing else would end the tasks). Waiting for slurmd to be
    gone before the tasks are killed took 1.5 s here, during which they trained on: a dead node's processes stop
    at once, so the scenario's clock starts at the kills. How many tasks were killed."""
    tasks = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            env = p.environ()
            if env.get("SLURMD_NODENAME") == node and env.get("HPR_AUTORESUME_JOB") == str(job_id):
                tasks.append(p)
    victims = list(tasks)
    if stepds:
        parents = {parent for t in tasks if (parent := _parent(t)) is not None}
        victims += [p for p in parents if _named(p, "slurmstepd")]
    slurmd = cl.kill_node(node, wait=False)
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.kill()
    devprocs.wait_gone([*([slurmd] if slurmd is not None else []), *(p.pid for p in victims)], 10.0)
    return len(tasks)


def _parent(p: psutil.Process) -> psutil.Process | None:
    try:
        return p.parent()
    except psutil.Error:
        return None


def _named(p: psutil.Process, name: str) -> bool:
    try:
        return name in p.name()
    except psutil.Error:
        return False


def _idle(cl: DevCluster, timeout: float) -> None:
    client = cl.client()
    deadline = time.monotonic() + timeout
    while not all(n.is_idle for n in client.nodes()):
        if time.monotonic() > deadline:
            raise JobFailed("the cluster did not come back idle between the runs")
        time.sleep(0.3)


def run_checkpointless(cl: DevCluster, work: Path, say: Any, timeout: float) -> tuple[bool, str]:
    """The three runs; (ok, the fields of the result line)."""
    fields: dict[str, Any] = {"faults": 0, "survivors_restarted": "-", "steps_recomputed": "-"}
    fields.update({"max_recovery_s": "-", "restart_path_s": "-", "weights_equal": "no"})
    ok = False
    try:
        say("run 1/3: in-process mode, no fault (the reference weights)")
        ref = Job(cl, work / "reference", "inprocess", 2)
        ref.finish(timeout)
        reference = ref.digests()
        _idle(cl, 60)
        say("run 2/3: in-process mode through two faults, no checkpoint anywhere")
        job = Job(cl, work / "faults", "inprocess", 2)
        recoveries = []
        try:
            job.wait(lambda: "step=10 " in job.out, "step 10", timeout)
            t0 = time.time()
            job.client.set_node_state(["n2"], "fail", "Action:Replace")
            say("fault 1: scontrol update node=n2 state=fail reason=Action:Replace")
            job.wait(lambda: len(job.in_world(2)) == 4, "generation 2", timeout)
            recoveries.append(max(float(j["at"]) for j in job.in_world(2)) - t0)
            say(f"  every rank training again after {recoveries[-1]:.2f} s: {job.events('inprocess_replaced')[-1]}")
            resumed = int(job.in_world(2)[0]["step"])
            job.wait(lambda: f"step={resumed + 10} " in job.out, "ten steps more", timeout)
            t0 = time.time()
            die_outright(cl, "n3", job.id)
            say("fault 2: n3 dies outright (its slurmd and its ranks killed)")
            job.wait(lambda: len(job.in_world(3)) == 4, "generation 3", timeout)
            recoveries.append(max(float(j["at"]) for j in job.in_world(3)) - t0)
            say(f"  every rank training again after {recoveries[-1]:.2f} s: {job.events('inprocess_replaced')[-1]}")
            job.finish(timeout)
        finally:
            job.cancel()
            cl.start_node("n3")
            with contextlib.suppress(Exception):
                job.client.set_node_state(["n2"], "resume")
        pids = {g: {j["rank"]: j["pid"] for j in job.in_world(g)} for g in (1, 2, 3)}
        steps = job.steps()
        fields.update(
            faults=len(recoveries),
            survivors_restarted=sum(pids[1][r] != pids[3][r] for r in ("0", "1")),
            steps_recomputed=len(steps) - len(set(steps)),
            max_recovery_s=f"{max(recoveries):.2f}",
            weights_equal="yes" if job.digests() == reference and len(reference) == 1 else "no",
        )
        _idle(cl, 60)
        say("run 3/3: the relaunch path through an Action:Replace, for comparison")
        fields["restart_path_s"] = f"{_relaunch(cl, work / 'relaunch', timeout):.2f}"
        ok = fields["weights_equal"] == "yes" and fields["survivors_restarted"] == 0
        ok = ok and fields["steps_recomputed"] == 0 and steps == list(range(1, STEPS + 1))
    except JobFailed as err:
        say(f"failed: {err}")
    return ok, " ".join(f"{k}={v}" for k, v in fields.items())


def _relaunch(cl: DevCluster, work: Path, timeout: float) -> float:
    job = Job(cl, work, "relaunch", 2)
    try:
        job.wait(lambda: "step=10 " in job.out, "step 10", timeout)
        before = len(job.joined())
        t0 = time.time()
        job.client.set_node_state(["n2"], "fail", "Action:Replace")
        job.wait(lambda: len(job.joined()) >= before + 4, "every rank of the relaunch", timeout)
        return max(float(j["at"]) for j in job.joined()[before:]) - t0
    finally:
        job.cancel()
        with contextlib.suppress(Exception):
            job.client.set_node_state(["n2"], "resume")
