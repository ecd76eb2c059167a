"""The bad-node notice in a job's AdminComment: written without touching the site's own text, read from
scontrol's multi-line job form (recorded format, Slurm 22.05), and the rule of which node leaves a step."""

from __future__ import annotations

import pytest

from hpresilience.slurm.models import Node
from hpresilience.slurm.notice import (
    WATCH_PREFIX,
    leaves_step,
    parse_admin_comment,
    parse_notice,
    parse_running_batch,
    parse_watch,
    planned_move,
    with_notice,
    with_word,
)

# `scontrol show job J` on 22.05 (our own job, same shape as the real output): AdminComment has a line of its own,
# before Comment; the one-line form would run both together.
SHOW_JOB = """JobId=30617000 JobName=wrap
   UserId=u(1000) GroupId=u(1000) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=n1 BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   Command=(null)
   WorkDir=/home/u
   AdminComment=site x=1 hpr:bad=n2@1764090077,n5@1764090079{sp}
   Comment=AdminComment=hpr:bad=n1@1 lr=0.1{sp}
   StdErr=/dev/null
""".format(sp=" ")  # scontrol ends these two lines with a space


def test_the_notice_is_read_from_the_admin_comment_line_not_from_the_users_comment() -> None:
    comment = parse_admin_comment(SHOW_JOB)
    assert comment == "site x=1 hpr:bad=n2@1764090077,n5@1764090079"
    assert parse_notice(comment) == {"n2": 1764090077, "n5": 1764090079}
    assert parse_admin_comment(SHOW_JOB.replace("   AdminComment=site", "   XAdmin=site")) == ""


@pytest.mark.parametrize("site", ["", "site x=1", "  spaced  text ", "a\tb", "hpr:badX=1"])
def test_the_notice_keeps_the_sites_admin_comment_byte_for_byte(site: str) -> None:
    told = with_notice(site, {"n2": 5, "n10": 7})
    assert parse_notice(told) == {"n2": 5, "n10": 7}
    updated = with_notice(told, {"n2": 5})
    assert parse_notice(updated) == {"n2": 5} and updated.replace("hpr:bad=n2@5", "").strip() == site.strip()
    assert with_notice(told, {}) == site
    assert with_notice(site, {}) == site


def test_a_malformed_notice_word_is_skipped_not_fatal() -> None:
    assert parse_notice("hpr:bad=n1@x,@5,n2@3") == {"n2": 3}
    assert parse_notice("nothing here") == {}


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
    told = with_notice(leased, {"n2": 5})
    assert parse_watch(told) == 1795637000 and parse_notice(told) == {"n2": 5}
    renewed = with_word(told, WATCH_PREFIX, f"{WATCH_PREFIX}1795637900")
    assert parse_watch(renewed) == 1795637900 and parse_notice(renewed) == {"n2": 5}
    assert with_word(with_notice(renewed, {}), WATCH_PREFIX, "") == site


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
