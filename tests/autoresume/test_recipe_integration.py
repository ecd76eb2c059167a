"""HyperPod's documented recipe (examples/hyperpod: batch.sh + train_auto_resume.sh with torchrun, no spares)
on the devcluster, driven only by what a user and an operator type: sbatch, the srun shim, scontrol.

Pins the main path: a node marked `Action:Replace` is replaced inside the same job and training resumes
from the user's own checkpoint with the uninterrupted result; a failed batch host is requeued onto healthy
nodes and released at once by the controller; a state file of another job with the same id is set aside."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from hpresilience.autoresume.decide.requeue import VIA_SLURM
from hpresilience.controller.jobwords import JobNotifier
from hpresilience.controller.loop import Controller
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.jobs import REQUEUE_MARKER
from hpresilience.testing.devcluster import DevCluster
from tests.conftest import TEST_BASE_PORT
from tests.controller.conftest import settings_for, start_controller, write_scripts  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "hyperpod"
SHIM_DIR = REPO / "slurm"
VENV_BIN = str(Path(sys.executable).parent)
STEPS = 30
INJECT = Path(__file__).parent / "data" / "train_inject.py"


def reference_weight(steps: int, world: int) -> float:
    spec = importlib.util.spec_from_file_location("hyperpod_train", RECIPE / "train.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return float(mod.reference(steps, world))


@contextlib.contextmanager
def job_notices(slurm: SlurmClient, every_s: float = 0.5) -> Iterator[None]:
    """What the controller's job thread does, and only that: tell running jobs of their bad nodes."""
    notifier = JobNotifier(slurm)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            with contextlib.suppress(HPResilienceError):
                notifier.notify(slurm.nodes_out_of_service())

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


class Recipe:
    """The recipe copied into a submit directory and submitted from there, as a user would."""

    def __init__(
        self,
        cluster: DevCluster,
        tmp: Path,
        steps: int = STEPS,
        extra_env: dict[str, str] | None = None,
        sbatch_args: tuple[str, ...] = (),
        inject: bool = False,
        srun_args: str = "",
    ) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        for f in ("batch.sh", "train_auto_resume.sh", "train.py"):
            shutil.copy(RECIPE / f, tmp / f)
        # The documented fixed port, moved away from other clusters' tests running on this machine.
        script = tmp / "train_auto_resume.sh"
        text = script.read_text().replace("--master_port=1234", f"--master_port={TEST_BASE_PORT + 900}")
        if inject:  # the same train.py, run with faults injected from the environment (data/train_inject.py)
            shutil.copy(INJECT, tmp / INJECT.name)
            text = text.replace('/train.py"', f'/{INJECT.name}"')
        script.write_text(text)
        if srun_args:  # the wrapper's own options on the recipe's srun line, as a user adds them
            batch = tmp / "batch.sh"
            batch.write_text(batch.read_text().replace("srun --auto-resume=1", f"srun --auto-resume=1 {srun_args}"))
        env = cluster.env()
        env.update(
            {
                "PATH": f"{SHIM_DIR}:{VENV_BIN}:{env.get('PATH', '')}",
                "CKPT_DIR": str(tmp / "ckpt"),
                "TRAIN_STEPS": str(steps),
                "TRAIN_STEP_SLEEP": "0.25",
                **(extra_env or {}),
            }
        )
        self.env = env
        res = subprocess.run(
            ["sbatch", "--parsable", *sbatch_args, "batch.sh"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        self.job_id = int(res.stdout.strip().split(";")[0])
        self.state = tmp / ".hpresilience" / "jobs"

    @property
    def out(self) -> str:
        p = self.tmp / f"auto-resume-{self.job_id}.out"
        return p.read_text(errors="replace") if p.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        p = self.state / f"{self.job_id}.events.jsonl"
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["event"] == event]

    def wait(self, probe: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := probe()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.out[-4000:]}")
            time.sleep(0.2)
        return value

    def wait_finished(self, timeout: float = 150.0) -> float:
        line = self.wait(
            lambda: re.search(r"training finished step=(\d+) weight0=(\S+)", self.out),
            "the training to finish",
            timeout,
        )
        assert int(line.group(1)) == STEPS
        return float(line.group(2))


def processes_of_attempt(job_id: int, attempt: int) -> list[psutil.Process]:
    """Live processes launched by attempt `attempt` of the job's wrapper (its tasks and their children)."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            env = p.environ()
            if env.get("HPR_AUTORESUME_JOB") == str(job_id) and env.get("AUTORESUME_ATTEMPT") == str(attempt):
                found.append(p)
    return found


def test_recipe_recovers_in_the_same_job_after_an_operator_replaces_a_node(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """(a) Default settings, no spares: Action:Replace on the non-batch node; the job grows into an idle node,
    torchrun starts again with the job's NodeList, the training resumes from the last checkpoint and ends
    with the uninterrupted weights, and no process of the first attempt is alive after the relaunch."""
    run = Recipe(cluster, tmp_path)
    run.wait(lambda: "step=8\n" in run.out, "step 8")
    job = slurm.job(run.job_id)
    victim = next(n for n in job.nodes if n != job.batch_host)
    with job_notices(slurm):  # the controller's job thread alone: the wrapper learns of the fault from its job
        slurm.set_node_state([victim], "fail", "Action:Replace")
        running = run.wait(lambda: [e for e in run.named("step_running")], "the relaunched step")
    assert run.named("node_fault_seen")[0]["node"] == victim
    assert not processes_of_attempt(run.job_id, 1)
    assert run.wait_finished() == pytest.approx(reference_weight(STEPS, 2), abs=1e-5)
    assert running[0]["restart_latency_s"] < 30  # a requeue would cost the 121 s hold
    starts = run.named("attempt_started")
    assert len(starts) == 2 and victim not in starts[1]["nodes"].split(",")
    assert run.named("allocation_grown") and not run.named("job_requeue_requested")
    resumed = [int(x) for x in re.findall(r"resumed from step (\d+)", run.out)]
    assert len(resumed) == 1 and 5 <= resumed[0] <= 15, run.out
    # The recipe's own view in the second attempt: the job's NodeList is the step's nodes, without the failed one.
    views = [line for line in run.out.splitlines() if line.startswith("node=")][-2:]
    lists = {re.search(r"NODE_LIST=(\S+)", v).group(1) for v in views}  # type: ignore[union-attr]
    assert len(lists) == 1, views
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", lists.pop()], env=run.env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert set(hosts) == set(starts[1]["nodes"].split(",")) and victim not in hosts
    assert slurm.job(run.job_id).job_id == run.job_id


def fill_the_rest(cluster: DevCluster, slurm: SlurmClient, run: Recipe, used: int) -> int:
    """Another job on every node the recipe does not hold: no idle node, no replacement at hand."""
    res = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-N",
            str(len(cluster.names()) - used),
            "--exclusive",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 600",
        ],
        env=run.env,
        capture_output=True,
        text=True,
        check=True,
    )
    filler = int(res.stdout.strip().split(";")[0])
    run.wait(lambda: slurm.job(filler).is_running, "the job that fills the cluster")
    assert not slurm.idle_nodes()
    return filler


def test_recipe_on_a_full_cluster_recovers_in_place_once_the_failed_node_is_repaired(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """No idle node anywhere (another job holds the rest of the partition): Action:Replace on the non-batch
    node leaves the wrapper waiting; the failed node itself, resumed under its own name (HyperPod's repair),
    is the replacement: the step runs again in the same job within 3 s of the resume, no requeue."""
    run = Recipe(cluster, tmp_path / "job")
    run.wait(lambda: "step=4\n" in run.out, "step 4")
    fill_the_rest(cluster, slurm, run, 2)
    job = slurm.job(run.job_id)
    victim = next(n for n in job.nodes if n != job.batch_host)
    with job_notices(slurm):
        slurm.set_node_state([victim], "fail", "Action:Replace")
        run.wait(lambda: run.named("waiting_for_replacement"), "the wait for a replacement")
        time.sleep(1.0)  # the repair takes a while; nothing else can be had meanwhile
        assert not run.named("no_replacement")
        slurm.set_node_state([victim], "resume")
        resumed_at = time.time()
        running = run.wait(lambda: run.named("step_running"), "the step running again", timeout=30)[0]
    delay = running["time"] - resumed_at
    print(f"node back in service -> step running: {delay:.2f} s")
    assert delay <= 3.0, delay
    assert run.wait_finished() == pytest.approx(reference_weight(STEPS, 2), abs=1e-5)
    assert not run.named("job_requeue_requested") and not run.named("no_replacement")
    assert run.named("allocation_grown")[0]["added"] == victim
    assert victim in run.named("attempt_started")[-1]["nodes"].split(",")
    assert slurm.job(run.job_id).restart_count == 0


def test_recipe_with_a_failed_batch_host_is_requeued_onto_healthy_nodes_and_released_at_once(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, start_controller: Callable[[Controller], Controller]
) -> None:
    """(b) The batch host is marked Action:Replace: it cannot leave the job, so the wrapper requeues the job;
    the controller starts it again at once (no two-minute hold) and repairs the node; in the new run the
    job's NodeList (what the recipe reads) and the step agree, the training resumes and ends right."""
    scripts = write_scripts(tmp_path / "scripts", cluster)
    start_controller(
        Controller(settings_for(scripts, tmp_path / "ctl", release_requeued_every_s=0.5, forced_down_after_s=60), slurm)
    )
    run = Recipe(cluster, tmp_path / "job")
    run.wait(lambda: "step=8\n" in run.out, "step 8")
    batch_host = slurm.job(run.job_id).batch_host
    slurm.set_node_state([batch_host], "fail", "Action:Replace")
    requeued = run.wait(lambda: run.named("job_requeue_requested"), "the requeue")[0]
    restarted = run.wait(
        lambda: [e for e in run.named("supervisor_started") if e["slurm_restart_count"] == 1],
        "the requeued batch run",
        timeout=60,
    )[0]
    assert restarted["time"] - requeued["time"] < 60  # Slurm alone would hold it for cred_expire + 1 s (121 s)
    assert run.named("no_replacement")[0]["batch_host"] is True
    assert run.wait_finished() == pytest.approx(reference_weight(STEPS, 2), abs=1e-5)
    # The output file was truncated when the batch script started again: what follows is the new run.
    views = [line for line in run.out.splitlines() if line.startswith("node=")]
    node_lists = {re.search(r"NODE_LIST=(\S+)", v).group(1) for v in views}  # type: ignore[union-attr]
    assert len(node_lists) == 1
    step_nodes = set(run.named("attempt_started")[-1]["nodes"].split(","))
    alloc = subprocess.run(
        ["scontrol", "show", "hostnames", node_lists.pop()], env=run.env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert set(alloc) == step_nodes
    assert "resumed from step" in run.out
    job = slurm.job(run.job_id)
    assert (
        job.restart_count == 1
        and REQUEUE_MARKER not in slurm.runner.run("scontrol", "show", "job", str(run.job_id)).stdout
    )


def test_recipe_with_a_failed_batch_host_is_back_running_through_slurms_expedited_requeue(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """(b') Where Slurm has it (25.11+, the devcluster's 26.05 turns it on), a job submitted with
    `--requeue=expedite` needs no controller: the wrapper requeues it without the marker and Slurm starts it again
    at once, off the failed batch host. Only the controller's notices run here (no release thread anywhere); Slurm's
    hold alone would be 121 s. On 22.05 and 24.11 the test above is the path."""
    features = slurm.features()
    if not features.expedited_requeue:
        pytest.skip(f"Slurm {features.version} has no expedited requeue (25.11+, enable_expedited_requeue)")
    run = Recipe(cluster, tmp_path / "job", sbatch_args=("--requeue=expedite",))
    with job_notices(slurm):
        run.wait(lambda: "step=8\n" in run.out, "step 8")
        batch_host = slurm.job(run.job_id).batch_host
        slurm.set_node_state([batch_host], "fail", "Action:Replace")
        requeued = run.wait(lambda: run.named("job_requeue_requested"), "the requeue")[0]
        restarted = run.wait(
            lambda: [e for e in run.named("supervisor_started") if e["slurm_restart_count"] == 1],
            "the requeued batch run",
            timeout=60,
        )[0]
    print(f"requeue requested -> requeued batch run started: {restarted['time'] - requeued['time']:.2f} s")
    assert requeued["via"] == VIA_SLURM and restarted["requeue_via"] == VIA_SLURM
    assert restarted["time"] - requeued["time"] < 30
    assert REQUEUE_MARKER not in slurm.runner.run("scontrol", "show", "job", str(run.job_id)).stdout
    step = run.wait(lambda: [e for e in run.named("attempt_started") if e["time"] >= restarted["time"]], "the step")
    assert batch_host not in step[0]["nodes"].split(",")
    run.wait(lambda: "resumed from step" in run.out, "the training resumed from its checkpoint")
    assert slurm.job(run.job_id).restart_count == 1
    slurm.cancel(run.job_id)  # the finished weights after a requeue are the test above's


def test_a_state_file_left_by_an_earlier_job_with_the_same_id_is_set_aside(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """(e) A cluster reinstall hands out job ids again: the new job finds `<id>.json` of an earlier job
    (two attempts, its own batch host blamed) and runs as a fresh job, the old file set aside and logged."""
    first = Recipe(cluster, tmp_path, steps=3)
    first.wait(lambda: first.named("job_step_succeeded"), "the first job")
    old = json.loads((first.state / f"{first.job_id}.json").read_text())
    second = Recipe(cluster, tmp_path, steps=3, sbatch_args=("--hold",))
    batch_nodes = slurm.nodes()
    # What the earlier job of that id left: attempts, and blamed nodes that this job will be given.
    old.update(
        {
            "job_id": second.job_id,
            "attempts": 2,
            "blamed_nodes": [n.name for n in batch_nodes],
            "kept_out": [n.name for n in batch_nodes],
        }
    )
    (second.state / f"{second.job_id}.json").write_text(json.dumps(old))
    (second.state / f"{second.job_id}.events.jsonl").write_text(json.dumps({"event": "old"}) + "\n")
    slurm.runner.run("scontrol", "release", str(second.job_id))
    second.wait(lambda: second.named("job_step_succeeded") or second.named("job_requeue_requested"), "job 2")
    assert second.named("job_step_succeeded"), second.out
    started = second.named("supervisor_started")
    assert len(started) == 1 and started[0]["attempts_so_far"] == 0
    assert "submitted at" in second.named("state_file_of_another_job")[0]["why"]
    assert next(e["event"] for e in second.events()) == "state_file_of_another_job"  # not the old job's log
    aside = list(second.state.glob(f"{second.job_id}.json.foreign-*"))
    assert aside and json.loads(aside[0].read_text())["attempts"] == 2
    state = json.loads((second.state / f"{second.job_id}.json").read_text())
    assert state["attempts"] == 1 and state["blamed_nodes"] == [] and state["submit_time"]
