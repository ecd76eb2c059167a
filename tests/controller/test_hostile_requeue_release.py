"""A hostile user against the controller's requeue release, on the real devcluster (issue 31, point 3).

The release runs as root: it starts a pending job at once (`scontrol update jobid=J StartTime=now`) and rewrites
its Comment. `nobody` submits a job whose Comment holds a newline and a lookalike `<victim>|BeginTime|hpr:requeued`
record; the victim is root's job, held with --begin. Neither the pending-queue scan nor the one-job read of a
told job may start the victim or touch its comment."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpresilience.controller.loop import Controller
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.jobs import REQUEUE_MARKER
from hpresilience.testing.devcluster import DevCluster
from tests.controller.conftest import Nobody, Scripts, settings_for, wait_until

pytestmark = pytest.mark.integration


def start_time(slurm: SlurmClient, job_id: int) -> str:
    return slurm.runner.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T %S").stdout.strip()


def comment_of(slurm: SlurmClient, job_id: int) -> str:
    """The comment alone, newlines and all (one plain job asked: its one record is the whole answer)."""
    return slurm.runner.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%k").stdout.removesuffix("\n")


@pytest.mark.parametrize("path", ["scan", "told"])
def test_a_comment_with_a_lookalike_record_never_starts_or_rewrites_another_users_job(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path, nobody: Nobody, path: str
) -> None:
    victim = slurm.sbatch("-N1", "-o", "/dev/null", "--begin=now+2hours", "--comment=victim", "--wrap", "true")
    forged = f"mine\n{victim}|BeginTime|{REQUEUE_MARKER} forged"
    hostile = nobody.sbatch("-N1", "--begin=now+1hour", f"--comment={forged}", "--wrap", "true")
    before = start_time(slurm, victim)
    assert before.startswith("PENDING ")
    ctl = Controller(settings_for(scripts, tmp_path / "state", watch_jobs_every_s=0), slurm)
    if path == "told":  # as if the controller had told the hostile job of a bad node: read by itself
        ctl.notifier.recent[hostile] = time.monotonic()
    assert ctl.release_requeued(scan=path == "scan") == 0
    time.sleep(1)  # a started job would be running (or done) by now
    assert start_time(slurm, victim) == before
    assert comment_of(slurm, victim) == "victim"
    assert comment_of(slurm, hostile) == forged  # and the user's own text is left as it was


def test_the_users_own_marked_job_is_still_released(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path, nobody: Nobody
) -> None:
    """The fix keeps the feature: a job whose own comment carries the marker (with newlines in it) starts at
    once, and comes back with its comment byte for byte, less the marker."""
    comment = f"line one\nline|two {REQUEUE_MARKER}"
    own = nobody.sbatch("-N1", "--begin=now+2hours", f"--comment={comment}", "--wrap", "sleep 30")
    ctl = Controller(settings_for(scripts, tmp_path / "state", watch_jobs_every_s=0), slurm)
    deadline = time.monotonic() + 20
    while ctl.release_requeued(scan=True) == 0:  # until the scheduler has given the job its BeginTime reason
        assert time.monotonic() < deadline, "the marked job was never released"
        time.sleep(0.5)
    # Started: it leaves PENDING (nobody's batch script then fails to launch on the devcluster, whose spool is
    # not nobody's to read: started all the same).
    wait_until(lambda: not start_time(slurm, own).startswith("PENDING"), f"job {own} to start", 20)
    assert comment_of(slurm, own) == "line one\nline|two"
