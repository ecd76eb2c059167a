"""SlurmClient over the fake runner: Slurm's answers scripted, the client's own code and the runner's error
path real. Pins two defects of issue 11 where a caller meets them, at the client."""

from __future__ import annotations

import json

import pytest

from hpresilience.errors import EXIT_EXTERNAL, EXIT_USAGE, SlurmError, SlurmTimeout, UnknownNode
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.steps import StepInfo, job_steps
from hpresilience.testing.fakerunner import FakeRunner
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"
NEW, OLD = "23.11.4", "22.05.8"


def finished_job_json(job_id: int) -> str:
    data = json.loads((SLURM / "scontrol_show_job_v0.0.41.json").read_text())
    data["jobs"][0].update(job_id=job_id, job_state=["COMPLETED"])
    return json.dumps(data)


# -- defect 1: one malformed `squeue -s` line aborted the whole step listing ------------------------------


def test_a_malformed_step_line_does_not_hide_the_good_ones() -> None:
    """The hostlist parser raises SlurmParseError, which the listing once let escape (it caught ValueError):
    one unreadable line cost the wrapper every step of the job. The good lines come back; the step with the
    unreadable node list is still listed (it can be cancelled by id), and a line of junk is skipped."""
    runner = FakeRunner(NEW).answer(
        "squeue", "-s", "-j", "42", stdout=("42.0|train|n[1-2]\n42.1|probe|n[1-\nnot a step line\n42.2|eval|n3\n")
    )
    steps = job_steps(SlurmClient(runner), 42)
    assert steps == [
        StepInfo("42.0", "train", ("n1", "n2")),
        StepInfo("42.1", "probe", ()),
        StepInfo("42.2", "eval", ("n3",)),
    ]
    assert runner.commands() == ["squeue -s -j 42 -h -o %i|%j|%N"]


def test_a_job_that_ended_has_no_steps_and_other_failures_name_the_command() -> None:
    runner = FakeRunner(NEW)
    runner.answer("squeue", "-s", "-j", "7", exit_code=1, stderr="slurm_load_jobs error: Invalid job id specified")
    runner.answer("squeue", "-s", "-j", "8", exit_code=1, stderr="Access/permission denied")
    client = SlurmClient(runner)
    assert job_steps(client, 7) == []
    with pytest.raises(SlurmError) as exc:
        job_steps(client, 8)
    assert exc.value.argv == ("squeue", "-s", "-j", "8", "-h", "-o", "%i|%j|%N") and exc.value.returncode == 1


# -- defect 2: errors named a command that never ran; a mistyped node was "Slurm failed" ------------------


@pytest.mark.parametrize(
    ("version", "argv", "out", "err"),
    [
        (
            NEW,
            ("scontrol", "--json", "show", "node", "nope"),
            '{"nodes": [], "errors": [{"error": "Invalid node name specified", "error_number": 2009}]}',
            "",
        ),
        (OLD, ("scontrol", "show", "node", "nope", "-o"), "Node nope not found\n", ""),
    ],
)
def test_a_mistyped_node_is_unknown_node_exit_2_naming_the_query_that_ran(
    version: str, argv: tuple[str, ...], out: str, err: str
) -> None:
    runner = FakeRunner(version).answer(*argv, exit_code=1, stdout=out, stderr=err)
    with pytest.raises(UnknownNode) as exc:
        SlurmClient(runner).node("nope")
    assert exc.value.exit_code == EXIT_USAGE and "unknown node(s): nope" in str(exc.value)
    assert exc.value.argv == argv
    assert runner.commands()[-1] == " ".join(argv)  # asked once: "not found" is an answer, not retried


def test_an_unknown_job_names_the_read_that_ran() -> None:
    """`job()` once named `scontrol show job J` while `scontrol --json show job J` had run."""
    runner = FakeRunner(NEW).answer(
        "scontrol", "--json", "show", "job", "99", exit_code=1, stderr="slurm_load_jobs error: Invalid job id specified"
    )
    client = SlurmClient(runner)
    assert client.job_or_none(99) is None
    with pytest.raises(SlurmError, match="job 99 is not known") as exc:
        client.job(99)
    assert exc.value.argv == ("scontrol", "--json", "show", "job", "99")


def test_a_job_that_ended_before_it_ran_names_the_read_not_squeue() -> None:
    """`wait_running` once blamed `squeue` (never run) for a job it had read with scontrol."""
    runner = FakeRunner(NEW).answer("scontrol", "--json", "show", "job", "5", stdout=finished_job_json(5))
    with pytest.raises(SlurmError, match=r"ended \(COMPLETED\) before it ran") as exc:
        SlurmClient(runner).wait_running(5, timeout=5)
    assert exc.value.argv == ("scontrol", "--json", "show", "job", "5")
    assert "squeue" not in runner.commands()[-1]


def test_a_refused_write_carries_command_exit_code_and_stderr() -> None:
    runner = FakeRunner(NEW).answer("scontrol", "update", exit_code=1, stderr="scontrol: error: Invalid user id\n")
    with pytest.raises(SlurmError) as exc:
        SlurmClient(runner).set_node_state(["n1"], "drain", "bad fan")
    err = exc.value
    assert err.argv == ("scontrol", "update", "nodename=n1", "state=DRAIN", "reason=bad fan")
    assert (err.returncode, err.stderr, err.exit_code) == (1, "scontrol: error: Invalid user id", EXIT_EXTERNAL)
    assert len(runner.calls) == 1  # a permanent refusal is not retried


def test_a_busy_slurmctld_is_retried_as_in_production() -> None:
    runner = FakeRunner(NEW)
    runner.answer("scontrol", "requeue", exit_code=1, stderr="Job update not available right now, try again")
    runner.answer("scontrol", "requeue")
    SlurmClient(runner).requeue(12)
    assert runner.commands() == ["scontrol requeue 12", "scontrol requeue 12"]


def test_a_hung_command_is_slurm_timeout_naming_it() -> None:
    runner = FakeRunner(NEW, retries=1).answer("sinfo", timeout=True)
    with pytest.raises(SlurmTimeout, match="`sinfo -h -a -o %D` timed out after 30 s") as exc:
        SlurmClient(runner).node_count()
    assert exc.value.argv == ("sinfo", "-h", "-a", "-o", "%D") and len(runner.calls) == 2


def test_cancel_jobs_of_a_user_cancels_scripts_and_steps_of_every_live_state() -> None:
    runner = FakeRunner(NEW).answer("scancel")
    SlurmClient(runner).cancel_jobs_of("alice")
    assert runner.commands() == ["scancel --full --quiet --state=RUNNING,PENDING,SUSPENDED --user=alice"]
