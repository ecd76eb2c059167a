"""The requeue release's readers on recorded output (issue 31): a job of `nobody` whose Comment holds a newline and
a lookalike `<victim>|BeginTime|hpr:requeued` record never makes another job look held, in the pending-queue scan
(framed records) or in the one-job reads (framed squeue on 22.05, JSON since 23.02)."""

from __future__ import annotations

import json

import pytest

from hpresilience.errors import SlurmParseError
from hpresilience.slurm import jobs
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.exact import framed_records
from hpresilience.slurm.jobs import HeldJob, held_among, held_job, parse_held, requeued_jobs_held
from hpresilience.testing.fakerunner import FakeRunner
from tests.conftest import FIXTURES, unmarked

SLURM = FIXTURES / "slurm"
MARK = "hpr0123456789abcdef01234567"  # the mark tests/fixtures/slurm/record_hostile.py recorded with
VICTIM, HOSTILE = 22000004, 22000005
UNFRAMED = (SLURM / "hostile_squeue_pending_22.05.txt").read_text()
FRAMED = (SLURM / "hostile_squeue_pending_framed_22.05.txt").read_text()
FORGED = f"mine\n{VICTIM}|BeginTime|hpr:requeued forged"


def test_the_unframed_listing_shows_a_forged_record_for_the_victim() -> None:
    """Why the scan is framed: line by line, the user's comment is a second record of the victim's job."""
    assert f"{VICTIM}|BeginTime|hpr:requeued forged" in UNFRAMED.splitlines()


def test_framed_records_keep_the_comment_whole_and_the_victim_unheld() -> None:
    assert framed_records(FRAMED, MARK, "squeue")[1] == f"{HOSTILE}|BeginTime|{FORGED}"
    assert parse_held(FRAMED, MARK) == []  # the marker is no word of the comment: nobody is held
    # With the marker as a word of its own comment, the user's own job is the one found, never the victim.
    own = FRAMED.replace("forged", "forged hpr:requeued")
    assert parse_held(own, MARK) == [HeldJob(HOSTILE, "BeginTime", FORGED + " hpr:requeued")]


@pytest.mark.parametrize(
    "text",
    [
        UNFRAMED,  # no mark at all
        FRAMED.replace(MARK, "hprffffffffffffffffffffffff"),  # another query's mark
        FRAMED.rstrip("\n"),  # cut short
    ],
)
def test_a_listing_of_any_other_shape_is_refused(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse_held(text, MARK)


def squeue_22_05(monkeypatch: pytest.MonkeyPatch, one_job: str) -> FakeRunner:
    monkeypatch.setattr(jobs, "record_mark", lambda: MARK)
    listing = FRAMED.replace("forged", "forged hpr:requeued")
    runner = FakeRunner("22.05.8").answer("squeue", "-h", "-t", "PD", stdout=listing)
    return runner.answer("squeue", "-h", "-j", stdout=one_job)


def test_the_scan_acts_on_no_job_before_reading_it_again_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job the scan found is read again with a one-job query; what that read says is what counts."""
    own = f"{MARK}{HOSTILE}|BeginTime|{FORGED} hpr:requeued\n"
    runner = squeue_22_05(monkeypatch, own)
    assert requeued_jobs_held(SlurmClient(runner)) == [HeldJob(HOSTILE, "BeginTime", FORGED + " hpr:requeued")]
    assert [c for c in unmarked(runner.commands()) if c != "scontrol --version"] == [
        "squeue -h -t PD -o MARK%A|%r|%k",
        f"squeue -h -j {HOSTILE} -t PD -o MARK%A|%r|%k",
    ]
    runner = squeue_22_05(monkeypatch, f"{MARK}{HOSTILE}|BeginTime|mine\n")  # taken off meanwhile
    assert requeued_jobs_held(SlurmClient(runner)) == []


@pytest.mark.parametrize(
    "answer",
    [
        f"{VICTIM}|BeginTime|hpr:requeued\n",  # unframed
        f"{MARK}{HOSTILE}|BeginTime|hpr:requeued\n",  # another job's record
        f"{MARK}{VICTIM}|BeginTime|hpr:requeued\n" * 2,  # the job twice
        f"{MARK}{VICTIM}|Priority|hpr:requeued\n",  # not under the requeue hold
        f"{MARK}{VICTIM}|BeginTime|hpr:requeuedX\n",  # no marker word
    ],
)
def test_the_one_job_read_on_22_05_holds_only_for_exactly_one_framed_record(
    monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    assert held_job(SlurmClient(squeue_22_05(monkeypatch, answer)), VICTIM) is None


def job_json(*records: dict[str, object]) -> str:
    """`scontrol --json show job J` as 24.11 prints it (recorded), with these records' fields changed."""
    data = json.loads((SLURM / "scontrol_show_job_24.11.json").read_text())
    data["jobs"] = [dict(data["jobs"][0], **r) for r in records]
    return json.dumps(data)


HELD = {"job_id": VICTIM, "job_state": ["PENDING"], "state_reason": "BeginTime", "comment": "a\nb hpr:requeued"}


@pytest.mark.parametrize(
    ("answer", "held"),
    [
        (job_json(HELD), True),
        (job_json(HELD, dict(HELD, job_id=HOSTILE)), True),  # an array's other tasks are left aside
        (job_json(dict(HELD, job_id=HOSTILE)), False),
        (job_json(HELD, HELD), False),  # the job twice: refused
        (job_json(dict(HELD, job_state=["RUNNING"])), False),
        (job_json(dict(HELD, comment="a\n22000004|BeginTime|x")), False),
        ('{"errors": [{"error": "Invalid job id specified"}]}', False),
        ("not json", False),
    ],
)
def test_the_one_job_read_since_23_02_is_the_json_record_of_that_job(answer: str, held: bool) -> None:
    runner = FakeRunner("24.11.5").answer("scontrol", "--json", "show", "job", str(VICTIM), stdout=answer)
    got = held_among(SlurmClient(runner), [VICTIM, VICTIM])  # a job named twice is read once
    assert got == ([HeldJob(VICTIM, "BeginTime", "a\nb hpr:requeued")] if held else [])
    assert runner.commands()[1:] == [f"scontrol --json show job {VICTIM}"]


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_the_recorded_json_of_a_hostile_job_holds_no_job(release: str) -> None:
    """Recorded on 24.11 and 26.05 (record_hostile.py inside their roots): nobody's job 22000001 with the
    lookalike record of the victim 22000000 in its comment. JSON keeps the comment whole: no job is held."""
    text = (SLURM / f"hostile_show_job_{release}.json").read_text()
    runner = FakeRunner(f"{release}.5").answer("scontrol", "--json", "show", "job", stdout=text)
    assert held_among(SlurmClient(runner), [22000000, 22000001]) == []
    record = json.loads(text)["jobs"][0]
    assert record["comment"] == "mine\n22000000|BeginTime|hpr:requeued forged"
