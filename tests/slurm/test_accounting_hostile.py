"""A hostile user against the accounting readers, on the real devcluster: a job (run as `nobody`) whose WorkDir
holds a newline and, after it, a lookalike `sacct -P` record of another user's earlier job pointing at a
directory of the attacker's with a made-up ledger; and whose JobName is ` UserId=root(0) GroupId=root(0)`.
Nothing about the other job changes in `hpresilience goodput`, `hpresilience job` or the controller's job
metrics, and the hostile job is shown as nobody's."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from hpresilience.goodput.ledgermetrics import LedgerCollector
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.conftest import reset_cluster
from tests.goodput.test_ledger import ev, one_fault

pytestmark = pytest.mark.integration


def hpr(cluster: DevCluster, *args: str) -> dict[str, Any]:
    res = subprocess.run(
        [sys.executable, "-m", "hpresilience", "--json", *args],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def plant(directory: Path, job_id: int, records: list[dict[str, Any]], owner: int = 0) -> None:
    """A job's decision records where the commands look for them, owned by the job's user."""
    jobs = directory / ".hpresilience" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / f"{job_id}.events.jsonl").write_text("".join(json.dumps({**r, "job_id": job_id}) + "\n" for r in records))
    for p in (directory, directory / ".hpresilience", jobs, jobs / f"{job_id}.events.jsonl"):
        os.chown(p, owner, owner)


def perfect_run() -> list[dict[str, Any]]:
    """One attempt, no fault: a goodput no faulty job has."""
    return [
        ev(0, "supervisor_started"),
        ev(0, "attempt_started", attempt=1, nodes="n1"),
        ev(60, "attempt_ended", attempt=1, decided_at=None, first_progress_at=None, last_progress_at=None),
        ev(60, "job_step_succeeded", attempt=1),
    ]


def wait_recorded(slurm: SlurmClient, jobs: list[int], texts: list[str]) -> None:
    """Until slurmdbd has every job's working directory (it learns it after the job's state)."""
    deadline = time.monotonic() + 60
    ids = ",".join(map(str, jobs))
    while True:
        out = slurm.runner.run("sacct", "-X", "-n", "-P", "-j", ids, "-o", "WorkDir", check=False).stdout
        if all(t in out for t in texts):
            return
        assert time.monotonic() < deadline, out
        time.sleep(0.5)


@dataclass(frozen=True)
class Attack:
    cluster: DevCluster
    slurm: SlurmClient
    victim: int
    hostile: int
    truth: dict[str, Any]  # `hpresilience job VICTIM` (slurmctld's record of it)


@pytest.fixture(scope="module")
def attack(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Attack:
    """The victim (root's finished job, its ledger in its own directory) and, after it, the hostile job."""
    reset_cluster(devcluster)
    slurm = devcluster.client()
    tmp = tmp_path_factory.mktemp("hostile")
    nobody = pwd.getpwnam("nobody").pw_uid
    victim_dir, fake_dir = tmp / "victim", tmp / "fake"
    victim_dir.mkdir()
    victim = slurm.sbatch("-o", "/dev/null", "-J", "victim", f"--chdir={victim_dir}", "--wrap", "true")
    plant(victim_dir, victim, one_fault())
    # The attacker's directory: its name carries the lookalike record of the victim (sacct -P's old field
    # order, JobID|User|Partition|WorkDir, State|Start|End following from the hostile job's own record).
    hostile_dir = tmp / f"h\n{victim}|nobody|fake|{fake_dir}"
    fake_dir.mkdir()
    hostile_dir.mkdir(parents=True)  # the fake path's slashes make it a tree: mkdir -p, as the attacker would
    os.chown(hostile_dir, nobody, nobody)
    plant(fake_dir, victim, perfect_run(), nobody)
    hostile = slurm.sbatch(
        f"--uid={nobody}", "-o", "/dev/null", f"--chdir={hostile_dir}", "-J", " UserId=root(0) GroupId=root(0)",
        "--wrap", "true",
    )  # fmt: skip
    # Whether it runs does not matter (24.11 fails a job whose directory its user cannot enter): Slurm
    # records it, WorkDir and JobName included, either way.
    plant(hostile_dir, hostile, perfect_run(), nobody)
    wait_recorded(slurm, [victim, hostile], [str(victim_dir), str(fake_dir)])
    truth = hpr(devcluster, "job", str(victim))
    assert (truth["user"], truth["partition"]) == ("root", "debug")
    return Attack(devcluster, slurm, victim, hostile, truth)


def test_goodput_lists_the_other_job_as_slurm_has_it_with_its_own_ledger(attack: Attack) -> None:
    listed = {j["job_id"]: j for j in hpr(attack.cluster, "goodput", "--since", "1h")["jobs"]}
    mine = listed[attack.victim]
    assert (mine["user"], mine["partition"], mine["goodput"]) == ("root", "debug", attack.truth["goodput"])
    assert listed[attack.hostile]["user"] == "nobody"
    assert listed[attack.hostile]["goodput"] != attack.truth["goodput"]  # the made-up ledger's figure differs


def test_job_shows_the_hostile_job_as_its_users_whatever_its_name_says(attack: Attack) -> None:
    shown = hpr(attack.cluster, "job", str(attack.hostile))
    assert (shown["user"], shown["partition"]) == ("nobody", "debug")


def test_the_job_metrics_label_the_other_job_as_slurm_has_it(attack: Attack) -> None:
    registry = CollectorRegistry()
    registry.register(LedgerCollector(attack.slurm, window_s=3600))
    samples = [s for m in registry.collect() for s in m.samples if s.labels.get("job_id") == str(attack.victim)]
    assert samples and {(s.labels["user"], s.labels["partition"]) for s in samples} == {("root", "debug")}
    ratio = registry.get_sample_value(
        "hpr_job_goodput_ratio", {"job_id": str(attack.victim), "user": "root", "partition": "debug"}
    )
    assert ratio == pytest.approx(attack.truth["goodput"], abs=1e-4)
