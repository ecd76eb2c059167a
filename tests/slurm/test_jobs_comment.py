"""The requeue marker and the job's identity, through the command runner: a user's comment comes back byte
for byte on the real devcluster, the identity read is retried, and a DB-index refusal is final at once."""

from __future__ import annotations

import pytest

from hpresilience.errors import SlurmError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.jobs import (
    REQUEUE_MARKER,
    held_among,
    job_comment,
    job_identity_details,
    set_job_comment,
    with_requeue_marker,
)
from hpresilience.slurm.runner import CountingRunner
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.fakerunner import FakeRunner
from tests.conftest import held_read, unmarked

COMMENT = "exp7 lr=0.1 bs=64  two|bars"


@pytest.mark.integration
def test_a_comment_with_key_value_words_survives_the_marker_byte_for_byte(
    cluster: DevCluster, slurm: SlurmClient
) -> None:
    job_id = slurm.sbatch("-N1", "-o", "/dev/null", f"--comment={COMMENT}", "--wrap", "sleep 300")
    runner = CountingRunner.like(cluster.client().runner)
    client = SlurmClient(runner)
    assert job_comment(client, job_id) == COMMENT
    set_job_comment(client, job_id, with_requeue_marker(job_comment(client, job_id), True))
    assert job_comment(client, job_id) == f"{COMMENT} {REQUEUE_MARKER}"
    set_job_comment(client, job_id, with_requeue_marker(job_comment(client, job_id), False))
    assert job_comment(client, job_id) == COMMENT
    # The comment is read alone, by a one-job query, never through the one-line job form.
    assert {c.split(" -o")[0] for c in runner.commands() if c.startswith("squeue")} == {f"squeue -h -j {job_id}"}


@pytest.mark.integration
def test_the_release_looks_only_at_the_jobs_named(cluster: DevCluster, slurm: SlurmClient) -> None:
    """held_among reads each named job by itself; a running job with the marker is not under the hold."""
    job_id = slurm.sbatch("-N1", "-o", "/dev/null", f"--comment={COMMENT} {REQUEUE_MARKER}", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    runner = CountingRunner.like(cluster.client().runner)
    client = SlurmClient(runner)
    assert client.version  # which release (the read it asks depends on it)
    runner.calls.clear()
    assert held_among(client, [job_id]) == []
    assert unmarked(runner.commands()) == [held_read(cluster, job_id)]


def test_an_empty_comment_reads_as_empty_and_a_failed_read_raises() -> None:
    runner = FakeRunner().answer("squeue", "-h", "-j", "5", stdout="(null)\n")
    assert job_comment(SlurmClient(runner), 5) == ""
    runner = FakeRunner(retries=0).answer("squeue", "-h", "-j", "5", exit_code=1, stderr="Socket timed out")
    with pytest.raises(SlurmError):
        job_comment(SlurmClient(runner), 5)


def test_the_identity_read_is_retried_until_slurm_answers() -> None:
    runner = FakeRunner()
    runner.answer("scontrol", "show", "job", "-o", "9", exit_code=1, stderr="Socket timed out on send/recv")
    runner.answer("scontrol", "show", "job", "-o", "9", stdout="JobId=9 SubmitTime=2026-11-25T17:01:17 Restarts=0\n")
    details = job_identity_details(SlurmClient(runner), 9, tries=3, within_s=0.01)
    assert details["SubmitTime"] == "2026-11-25T17:01:17"
    assert runner.commands().count("scontrol show job -o 9") == 2


def test_an_identity_never_read_is_empty_after_every_try() -> None:
    runner = FakeRunner().answer("scontrol", "show", "job", "-o", "9", exit_code=1, stderr="Socket timed out")
    assert job_identity_details(SlurmClient(runner), 9, tries=3, within_s=0.01) == {}
    assert runner.commands().count("scontrol show job -o 9") == 3


def test_a_db_index_refusal_is_final_at_once() -> None:
    """slurmctld's "DB index is being set, try again in a bit" never clears for the job it names: one
    command, no retry (each costs slurmctld 5 s); an ordinary busy answer is still retried."""
    refusal = "Job update not available right now, the DB index is being set, try again in a bit for JobId=4"
    runner = FakeRunner().answer("scontrol", "update", exit_code=1, stderr=refusal)
    with pytest.raises(SlurmError, match="DB index"):
        SlurmClient(runner).runner.run("scontrol", "update", "jobid=4", "NodeList=n1")
    assert runner.commands().count("scontrol update jobid=4 NodeList=n1") == 1
    busy = FakeRunner().answer("scontrol", "update", exit_code=1, stderr="Socket timed out on send/recv")
    busy.answer("scontrol", "update", stdout="")
    SlurmClient(busy).runner.run("scontrol", "update", "jobid=4", "NodeList=n1")
    assert busy.commands().count("scontrol update jobid=4 NodeList=n1") == 2
