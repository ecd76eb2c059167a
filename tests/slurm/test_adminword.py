"""The admin word (bad nodes, the lease) in a job's AdminComment: written without touching the site's own text,
read exactly as a field of its own (framed squeue on 22.05, JSON since 23.02; recorded output), and the rule of
which node leaves a step."""

from __future__ import annotations

import json

import pytest

from hpresilience.errors import SlurmParseError
from hpresilience.slurm import adminword
from hpresilience.slurm.adminword import (
    WATCH_PREFIX,
    AdminWord,
    admin_comment_format,
    leaves_step,
    parse_admin_comment,
    parse_bad_nodes,
    parse_running_batch,
    parse_watch,
    planned_move,
    read_admin_word,
    with_bad_nodes,
    with_word,
)
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.testing.fakerunner import FakeRunner
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"

# Recorded on 22.05 (tests/fixtures/slurm/record_hostile.py): a victim job whose site AdminComment is "site note",
# and a job of `nobody` whose JobName, WorkDir and Comment hold lines that look like an AdminComment.
SHOW_JOB = (SLURM / "hostile_show_job_22.05.txt").read_text()
ADMIN = (SLURM / "hostile_squeue_admin_comment_22.05.txt").read_text()
MARK = "hpr0123456789abcdef01234567"
VICTIM, HOSTILE = 22000004, 22000005


def test_the_text_form_shows_admin_comment_lookalikes_from_user_fields() -> None:
    """Why scontrol's multi-line form is never read for AdminComment: the user's JobName and WorkDir print
    `AdminComment=` lines of their own (the job has no AdminComment)."""
    assert [ln.strip() for ln in SHOW_JOB.splitlines() if ln.strip().startswith("AdminComment=")] == [
        "AdminComment=hpr:watch=1 from-jobname",
        "AdminComment=hpr:bad=n3@1 from-workdir",
    ]


def test_the_admin_comment_is_read_from_its_own_framed_field() -> None:
    assert parse_admin_comment(ADMIN, MARK, HOSTILE) == ""
    assert parse_admin_comment(ADMIN, MARK, VICTIM) == "site note"
    assert parse_admin_comment(ADMIN, MARK, 1) is None  # not listed: the job is gone


@pytest.mark.parametrize(
    "text",
    [
        ADMIN.replace(MARK, "hprffffffffffffffffffffffff"),  # not this query's mark
        ADMIN.rstrip("\n"),  # cut short
        ADMIN + ADMIN,  # the job twice
        "22000005" + MARK + "x\n",  # a record missing its second mark
    ],
)
def test_an_admin_comment_answer_of_any_other_shape_is_refused(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse_admin_comment(text, MARK, HOSTILE)


def test_on_22_05_the_notice_is_read_with_squeue_never_from_the_text_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adminword, "record_mark", lambda: MARK)
    runner = FakeRunner("22.05.8").answer("squeue", stdout=ADMIN)
    got = read_admin_word(SlurmClient(runner), HOSTILE)
    assert got == AdminWord({}, "", found=True)
    assert runner.commands()[-1] == f"squeue -h -t all -j {HOSTILE} -O " + admin_comment_format(MARK)


def test_on_23_02_and_later_the_notice_is_read_from_json() -> None:
    """`scontrol --json show job J` (recorded 24.11 shape): the record of the job asked, its admin_comment
    field alone, whatever its other fields hold."""
    data = json.loads((SLURM / "scontrol_show_job_24.11.json").read_text())
    first = data["jobs"][0]
    data["jobs"] = [
        dict(first, job_id=7, name="x\n   AdminComment=hpr:watch=1", comment="AdminComment=hpr:bad=n1@1"),
        dict(first, job_id=8, admin_comment="hpr:bad=n9@9"),
    ]
    runner = FakeRunner("24.11.5").answer("scontrol", "--json", "show", "job", stdout=json.dumps(data))
    assert read_admin_word(SlurmClient(runner), 7) == AdminWord({}, "", found=True)
    assert read_admin_word(SlurmClient(runner), 8).bad == {"n9": 9}
    assert read_admin_word(SlurmClient(runner), 9).found is False
    data["jobs"].append(data["jobs"][0])
    runner = FakeRunner("24.11.5").answer("scontrol", "--json", "show", "job", stdout=json.dumps(data))
    with pytest.raises(SlurmParseError):
        read_admin_word(SlurmClient(runner), 7)


@pytest.mark.parametrize("site", ["", "site x=1", "  spaced  text ", "a\tb", "hpr:badX=1"])
def test_the_notice_keeps_the_sites_admin_comment_byte_for_byte(site: str) -> None:
    told = with_bad_nodes(site, {"n2": 5, "n10": 7})
    assert parse_bad_nodes(told) == {"n2": 5, "n10": 7}
    updated = with_bad_nodes(told, {"n2": 5})
    assert parse_bad_nodes(updated) == {"n2": 5} and updated.replace("hpr:bad=n2@5", "").strip() == site.strip()
    assert with_bad_nodes(told, {}) == site
    assert with_bad_nodes(site, {}) == site


def test_a_malformed_notice_word_is_skipped_not_fatal() -> None:
    assert parse_bad_nodes("hpr:bad=n1@x,@5,n2@3") == {"n2": 3}
    assert parse_bad_nodes("nothing here") == {}


def node(*states: str, reason: str = "") -> Node:
    return Node(name="n1", address="a", hostname="h", states=frozenset(states), reason=reason)


def test_a_node_leaves_the_step_when_broken_or_its_reason_asks_for_an_action() -> None:
    assert leaves_step(node("ALLOCATED", "FAIL"))
    assert leaves_step(node("IDLE", "DOWN"))
    assert leaves_step(node("ALLOCATED", "NOT_RESPONDING"))
    assert leaves_step(node("ALLOCATED", "DRAIN", reason="Action:Replace"))
    assert not leaves_step(node("ALLOCATED", "DRAIN", reason="operator: maintenance"))
    assert not leaves_step(node("ALLOCATED"))


@pytest.mark.parametrize("site", ["", "site x=1", "  spaced  text ", "hpr:watchX=1"])
def test_the_watch_lease_and_the_notice_live_side_by_side_and_keep_the_sites_text(site: str) -> None:
    leased = with_word(site, WATCH_PREFIX, f"{WATCH_PREFIX}1795637000")
    told = with_bad_nodes(leased, {"n2": 5})
    assert parse_watch(told) == 1795637000 and parse_bad_nodes(told) == {"n2": 5}
    renewed = with_word(told, WATCH_PREFIX, f"{WATCH_PREFIX}1795637900")
    assert parse_watch(renewed) == 1795637900 and parse_bad_nodes(renewed) == {"n2": 5}
    assert with_word(with_bad_nodes(renewed, {}), WATCH_PREFIX, "") == site


def test_a_missing_or_malformed_lease_reads_as_no_lease() -> None:
    assert parse_watch("site x=1") == 0
    assert parse_watch("hpr:watch=soon") == 0
    assert parse_watch("hpr:bad=n1@5 hpr:watch=77") == 77


# `sacct -a -n -P -s R -o JobIDRaw,State` on 22.05 (same shape as the real output): a batch job has its `.batch`
# step, an salloc job (21500002) has none, an extern step and a finished step are not the batch step.
SACCT_RUNNING = """21500001|RUNNING
21500001.batch|RUNNING
21500001.extern|RUNNING
21500002|RUNNING
21500002.0|RUNNING
21500003|RUNNING
21500003.batch|COMPLETED
junk
x.batch|RUNNING
"""


def test_only_jobs_whose_batch_step_runs_are_watched() -> None:
    assert parse_running_batch(SACCT_RUNNING) == {21500001}


def test_a_drained_node_without_a_fault_is_a_planned_move_and_a_faulty_one_is_not() -> None:
    assert planned_move(node("ALLOCATED", "DRAIN", reason="[hpr-agent] Planned:spot-interruption by 2026-11-25T23:59Z"))
    assert planned_move(node("MIXED", "DRAIN", reason="operator: maintenance"))
    assert not planned_move(node("ALLOCATED", "DRAIN", reason="Action:Replace"))  # leaves at once instead
    assert not planned_move(node("ALLOCATED", "DRAIN", "FAIL"))
    assert not planned_move(node("IDLE", "DRAIN", "DOWN"))
    assert not planned_move(node("ALLOCATED"))


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_the_recorded_json_of_a_hostile_job_reads_as_its_empty_admin_comment(release: str) -> None:
    """Recorded on 24.11 and 26.05: nobody's job whose JobName and WorkDir hold `AdminComment=` lines."""
    text = (SLURM / f"hostile_show_job_{release}.json").read_text()
    runner = FakeRunner(f"{release}.5").answer("scontrol", "--json", "show", "job", stdout=text)
    assert read_admin_word(SlurmClient(runner), 22000001) == AdminWord({}, "", found=True)
    assert "AdminComment=hpr:watch=1" in json.loads(text)["jobs"][0]["name"]
