"""A node cut off under synchronous training (issue 36), on `devcluster up --isolation netns` with its default
settings (SlurmdTimeout 30 s), jobs submitted as a user would (sbatch without --no-kill, the srun shim, default
wrapper settings, no controller).

Every rank blocks in the next all-reduce when one node is partitioned, so the whole step goes silent at once and
only rank 0 ever printed: the stall watch probes every node, the cut one runs no task, and the step goes again on
the spare within seconds, in the same job. The cut node leaves the job at once: Slurm sets it DOWN after
SlurmdTimeout and would otherwise requeue the whole job for it (46 s after the cut, before this watch). A step
silent because the training paused, every node reachable, is left alone."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.netns import Isolation
from tests.autoresume.test_recipe_integration import RECIPE, processes_of_attempt
from tests.conftest import TEST_BASE_PORT, require_slurm
from tests.testing.test_netns_integration import need_netns

pytestmark = pytest.mark.integration
PORT = TEST_BASE_PORT + 650  # away from the fault-sequence (+600) and netns (+700) modules' clusters
REPO = Path(__file__).resolve().parents[2]
TRAIN_SYNC = REPO / "tests" / "autoresume" / "data" / "train_sync.py"
SHIM_DIR = REPO / "slurm"
VENV_BIN = str(Path(sys.executable).parent)
# 7.9-8.3 s here before the preflight of the spare (decide/preflight.py), which adds ~2 s (1.8 s measured) to a
# relaunch onto a node that did not run the previous attempt; the bound leaves a busy CI machine some slack.
CUT_TO_RELAUNCH_S = 10.0


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    need_netns()
    cl = DevCluster(
        state_dir=tmp_path_factory.mktemp("partition") / "cluster", nodes=3, base_port=PORT, isolation=Isolation.NETNS
    )
    cl.up(timeout=60)
    yield cl
    cl.down()


class Job:
    """A batch job submitted from `tmp` (its submit directory) with `script` as its batch script."""

    def __init__(self, cl: DevCluster, tmp: Path, script: str, env: dict[str, str], *sbatch: str) -> None:
        self.cl, self.tmp = cl, tmp
        (tmp / "ckpt").mkdir(parents=True, exist_ok=True)
        (tmp / "job.sh").write_text(script)
        self.env = cl.env()
        self.env.update({"PATH": f"{SHIM_DIR}:{VENV_BIN}:{self.env.get('PATH', '')}", "CKPT_DIR": str(tmp / "ckpt")})
        self.env.update(env)
        res = subprocess.run(
            [*cl.command_prefix(), "sbatch", "--parsable", "-o", str(tmp / "out"), *(sbatch or ("-N3",)), "job.sh"],
            cwd=tmp,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert res.returncode == 0, res.stderr
        self.job_id = int(res.stdout.strip().split(";")[0])
        self.state = tmp / ".hpresilience" / "jobs"

    @property
    def out(self) -> str:
        p = self.tmp / "out"
        return p.read_text(errors="replace") if p.exists() else ""

    def named(self, event: str) -> list[dict[str, Any]]:
        p = self.state / f"{self.job_id}.events.jsonl"
        lines = p.read_text().splitlines() if p.exists() else []
        return [e for e in map(json.loads, lines) if e["event"] == event]

    def wait(self, probe: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := probe()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{self.out[-3000:]}")
            time.sleep(0.1)
        return value

    def steps(self, pattern: str = r"^step[= ](\d+)$") -> list[int]:
        return [int(m) for m in re.findall(pattern, self.out, re.MULTILINE)]


def sync_job(cl: DevCluster, tmp: Path, nodes: int = 3, **env: str) -> Job:
    spares = "--auto-resume-spares=1 " if nodes == 3 else ""
    script = f"#!/bin/bash\nsrun --auto-resume=1 {spares}-N2 {sys.executable} {TRAIN_SYNC}\necho wrapper_rc=$?\n"
    return Job(cl, tmp, script, env, f"-N{nodes}")


def recipe_job(cl: DevCluster, tmp: Path) -> Job:
    """HyperPod's recipe as documented (torchrun inside), on 3 nodes with one spare."""
    for f in ("train_auto_resume.sh", "train.py"):
        shutil.copy(RECIPE / f, tmp / f)
    batch = (RECIPE / "batch.sh").read_text()
    batch = batch.replace("srun --auto-resume=1", "srun --auto-resume=1 --auto-resume-spares=1 -N2")
    batch = batch.replace("#SBATCH -o auto-resume-%j.out\n", "")
    return Job(cl, tmp, batch, {"TRAIN_STEPS": "100000", "TRAIN_STEP_SLEEP": "0.25"})


@contextlib.contextmanager
def ended(slurm: SlurmClient, job: Job) -> Iterator[None]:
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(job.job_id)


def wait_idle(cl: DevCluster, slurm: SlurmClient) -> None:
    deadline = time.monotonic() + 90
    while not all(n.is_idle for n in slurm.nodes(cl.names())):
        if time.monotonic() > deadline:
            raise AssertionError("the cluster's nodes are not idle")
        time.sleep(0.5)


def cut_and_check(cl: DevCluster, slurm: SlurmClient, job: Job, victim: str, last_step: int, resumed: str) -> None:
    """Partition `victim`; the step must run again without it within CUT_TO_RELAUNCH_S, in the same job, and stay
    there once Slurm calls the victim DOWN; after heal no task of the first attempt is left."""
    cut_at = time.time()
    cl.partition(victim)
    running = job.wait(lambda: job.named("step_running"), "the relaunch", 60)
    took = running[0]["time"] - cut_at
    print(f"partition of {victim} -> step running again in {took:.1f} s")
    probed = [e for e in job.named("silent_step_probed") if e.get("unanswering")]
    assert probed and probed[0]["unanswering"] == victim and probed[0]["blamed"] == victim
    assert took <= CUT_TO_RELAUNCH_S, took
    second = job.named("attempt_started")[1]["nodes"].split(",")
    assert victim not in second and len(second) == 2
    fault = job.named("fault_seen")[-1]
    assert fault["cause"] == "hardware" and fault["nodes"] == victim
    assert victim in [e["released"] for e in job.named("allocation_shrunk")]
    # Training resumes from its checkpoint (step > the cut's), and goes on past Slurm's DOWN of the cut node.
    m = job.wait(lambda: re.search(resumed, job.out, re.MULTILINE), "the resume")
    assert int(m.group(1)) >= last_step - 1
    job.wait(lambda: slurm.node(victim).has("DOWN"), "Slurm to call the cut node DOWN (SlurmdTimeout)", 120)
    time.sleep(3)  # Slurm acts on a down node's jobs as it marks it
    after = max(job.steps())
    job.wait(lambda: max(job.steps()) > after, "training after the node went down", 30)
    now = slurm.job(job.job_id)
    assert now.state == "RUNNING" and now.restart_count == 0 and victim not in now.nodes
    assert not job.named("job_requeue_requested")
    old = [p for p in processes_of_attempt(job.job_id, 1) if p.environ().get("SLURMD_NODENAME") == victim]
    cl.heal(victim)
    job.wait(
        lambda: (
            not [p for p in old if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            and not [p for p in processes_of_attempt(job.job_id, 1)]
        ),
        "the first attempt's tasks to end once the node is healed",
        90,
    )


def test_a_partitioned_node_under_synchronous_gloo_training_is_replaced_by_the_spare_in_the_same_job(
    hosts: DevCluster, tmp_path: Path
) -> None:
    slurm = hosts.client()
    wait_idle(hosts, slurm)
    job = sync_job(hosts, tmp_path)
    with ended(slurm, job):
        job.wait(lambda: 5 in job.steps(), "step 5", 90)
        first = job.named("attempt_started")[0]["nodes"].split(",")
        victim = first[1]
        assert victim != slurm.job(job.job_id).batch_host
        assert not job.named("silent_step_probed")  # a healthy run costs no probe
        try:
            cut_and_check(hosts, slurm, job, victim, 5, r"^resumed from step (\d+)$")
        finally:
            hosts.heal(victim)


def test_the_hyperpod_recipe_with_torchrun_and_a_spare_recovers_from_a_partition_in_the_same_job(
    hosts: DevCluster, tmp_path: Path
) -> None:
    slurm = hosts.client()
    wait_idle(hosts, slurm)
    job = recipe_job(hosts, tmp_path)
    with ended(slurm, job):
        job.wait(lambda: 5 in job.steps(), "step 5", 120)
        victim = job.named("attempt_started")[0]["nodes"].split(",")[1]
        assert victim != slurm.job(job.job_id).batch_host
        try:
            cut_and_check(hosts, slurm, job, victim, 5, r"^resumed from step (\d+)$")
        finally:
            hosts.heal(victim)
        # The recipe's own view of the second attempt: the job's NodeList, without the cut node.
        views = [line for line in job.out.splitlines() if line.startswith("node=")][-2:]
        assert views and all(victim not in v.split("NODE_LIST=")[1].split()[0] for v in views), views


def test_without_a_spare_the_job_grows_into_an_idle_node_after_a_partition_and_lets_the_cut_node_go(
    hosts: DevCluster, tmp_path: Path
) -> None:
    slurm = hosts.client()
    wait_idle(hosts, slurm)
    job = sync_job(hosts, tmp_path, nodes=2)
    with ended(slurm, job):
        job.wait(lambda: 5 in job.steps(), "step 5", 90)
        victim = job.named("attempt_started")[0]["nodes"].split(",")[1]
        assert victim != slurm.job(job.job_id).batch_host
        cut_at = time.time()
        hosts.partition(victim)
        try:
            running = job.wait(lambda: job.named("step_running"), "the relaunch", 60)
            print(f"partition of {victim}, no spare -> step running again in {running[0]['time'] - cut_at:.1f} s")
            assert running[0]["time"] - cut_at <= CUT_TO_RELAUNCH_S
            assert job.named("allocation_grown") and victim in [e["released"] for e in job.named("allocation_shrunk")]
            assert victim not in job.named("attempt_started")[1]["nodes"].split(",")
            m = job.wait(lambda: re.search(r"^resumed from step (\d+)$", job.out, re.MULTILINE), "the resume")
            job.wait(lambda: max(job.steps()) > int(m.group(1)) + 2, "training on the grown job", 30)
            assert victim not in slurm.job(job.job_id).nodes
        finally:
            hosts.heal(victim)


def test_a_step_silent_everywhere_because_training_paused_is_not_relaunched(hosts: DevCluster, tmp_path: Path) -> None:
    slurm = hosts.client()
    wait_idle(hosts, slurm)
    job = sync_job(hosts, tmp_path, PAUSE_AT="5", PAUSE_S="15", TRAIN_STEPS="10")
    with ended(slurm, job):
        job.wait(lambda: "wrapper_rc=" in job.out, "the job's end", 120)
        assert job.out.split("wrapper_rc=")[-1].strip() == "0", job.out
        assert "training finished step 10" in job.out
        assert len(job.named("attempt_started")) == 1 and not job.named("fault_seen")
        probed = job.named("silent_step_probed")
        # The pause was looked at (every node answered) and each next look at the same silence waited twice as long
        # as the last one's: a probe per doubling of the pause, never one per poll. How many doublings a 15 s pause
        # makes depends on how slowly the step resumes on a loaded machine (4 were seen under CI's load), and a slow
        # step after it can be a silence of its own, probed from the base threshold again (seen under CI's load).
        assert probed and not any(e.get("unanswering") for e in probed), probed
        assert max(e["silent_s"] for e in probed) >= 6, probed
        for before, after in itertools.pairwise(probed):
            if after["silent_since"] == before["silent_since"]:
                assert after["threshold_s"] >= 2 * before["silent_s"] - 0.1, probed
