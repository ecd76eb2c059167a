"""The bad-node notice in a job's AdminComment: written without touching the site's own text, read from
scontrol's multi-line job form (recorded format, Slurm 22.05), and the rule of which node leaves a step."""

from __future__ import annotations

import pytest

from hpresilience.slurm.models import Node
from hpresilience.slurm.notice import leaves_step, parse_admin_comment, parse_notice, planned_move, with_notice

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


def test_a_drained_node_without_a_fault_is_a_planned_move_and_a_faulty_one_is_not() -> None:
    assert planned_move(node("ALLOCATED", "DRAIN", reason="[hpr-agent] Planned:spot-interruption by 2026-11-25T23:59Z"))
    assert planned_move(node("MIXED", "DRAIN", reason="operator: maintenance"))
    assert not planned_move(node("ALLOCATED", "DRAIN", reason="Action:Replace"))  # leaves at once instead
    assert not planned_move(node("ALLOCATED", "DRAIN", "FAIL"))
    assert not planned_move(node("IDLE", "DRAIN", "DOWN"))
    assert not planned_move(node("ALLOCATED"))
