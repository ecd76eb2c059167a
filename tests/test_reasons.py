"""The shared reason vocabulary: what operators type and what our parts write read back the same."""

from __future__ import annotations

import pytest

from hpresilience.reasons import (
    Action,
    PlannedKind,
    PlannedReason,
    agent_reason,
    controller_reason,
    iso_utc,
    parse_planned,
    parse_reason,
    planned_reason,
)


@pytest.mark.parametrize(
    "reason,action,owner",
    [
        ("Action:Replace", Action.REPLACE, None),
        ("action:reboot please", Action.REBOOT, None),
        ("Action:Replace [hpr-agent] xid=79", Action.REPLACE, "agent"),
        ("[hpr-controller] repairing: reboot", None, "controller"),
        ("Not responding", None, None),
        ("", None, None),
        ("Action:Replaced", None, None),
        # Issue 14 item 14: the tag counts only where our parts write it (first, or right after the action).
        ("drained by ops; not [hpr-agent]", None, None),
        ("Action:Replace per ticket [hpr-controller]", Action.REPLACE, None),
        ("Action:Reboot [hpr-controller] repairing", Action.REBOOT, "controller"),
        ("  [hpr-agent] x", None, "agent"),
    ],
)
def test_parse_reason(reason: str, action: Action | None, owner: str | None) -> None:
    p = parse_reason(reason)
    assert p.action == action and p.owner == owner


def test_written_reasons_round_trip_and_stay_safe() -> None:
    r = agent_reason(Action.REBOOT, 'xid=48 "double-bit"\nECC')
    assert '"' not in r and "\n" not in r
    p = parse_reason(r)
    assert p.action == Action.REBOOT and p.owner == "agent" and p.detail.startswith("xid=48")
    assert parse_reason(controller_reason("needs a person", Action.REPLACE)).owner == "controller"
    assert len(agent_reason(Action.REPLACE, "x" * 1000)) == 200


def test_one_action_scale_and_both_spellings() -> None:
    """The rank orders none < reboot < replace; the value is the word of `check --json` and the controller's
    ladder, `reason_word` the one Slurm reasons carry."""
    assert sorted(Action, key=lambda a: a.rank) == [Action.NONE, Action.REBOOT, Action.REPLACE]
    assert [a.value for a in Action] == ["none", "reboot", "replace"]
    assert (Action.REPLACE.reason_word, Action.REBOOT.reason_word) == ("Replace", "Reboot")
    assert agent_reason(Action.REPLACE, "x").startswith("Action:Replace [hpr-agent] x")
    assert controller_reason("y", Action.REBOOT) == "Action:Reboot [hpr-controller] y"
    assert controller_reason("y", Action.NONE) == controller_reason("y") == "[hpr-controller] y"
    assert parse_reason("ACTION:REPLACE now").action is Action.REPLACE
    with pytest.raises(ValueError):
        agent_reason(Action.NONE, "nothing to ask")


def test_verdict_check_findings_and_the_guard_all_rank_by_action_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank, not three tables: with the rank reversed, the node verdict, a check's worst sub-finding and
    the agent's guard all change their pick together (a private table in any of them would not)."""
    from hpresilience.agent.guard import Memory, decide
    from hpresilience.agent.settings import AgentSettings
    from hpresilience.health.base import CheckResult, Kind, Status
    from hpresilience.health.checks.common import report
    from hpresilience.health.verdict import aggregate
    from hpresilience.slurm.models import Node

    reboot = CheckResult("a", "gpu", Kind.PASSIVE, Status.FAIL, Action.REBOOT, "r", key="a", certain=True)
    replace = CheckResult("b", "gpu", Kind.PASSIVE, Status.FAIL, Action.REPLACE, "r", key="b", certain=True)
    idle = Node(name="n1", address="", hostname="", states=frozenset({"IDLE"}))

    def picks() -> list[str]:
        verdict = aggregate([reboot, replace]).deciding
        decision = decide(idle, [idle] * 10, [reboot, replace], Memory(), AgentSettings(), 0.0).finding
        assert verdict is not None and decision is not None
        return [verdict.check, report([reboot, replace], {}).check, decision.check]

    assert picks() == ["b", "b", "b"]
    order = [Action.REPLACE, Action.REBOOT, Action.NONE]
    monkeypatch.setattr(Action, "rank", property(lambda a: order.index(a)))
    assert picks() == ["a", "a", "a"]


def test_a_node_left_for_a_person_reads_as_the_controllers_and_asks_nothing() -> None:
    from hpresilience.reasons import person_reason

    r = person_reason("repaired 3 times within 7 d")
    assert r.startswith("hpr: needs a person") and parse_reason(r).owner == "controller"
    assert parse_reason(r).action is None
    assert parse_reason("hpr: fan replaced").owner is None  # only the exact prefix is ours


def test_planned_reason_reads_back_kind_deadline_and_detail_and_asks_no_action() -> None:
    """Issue 25: a cloud notice's drain is the agent's, carries no Action word (nothing to repair), and its
    kind and deadline (ISO 8601 UTC to the second) read back exactly."""
    deadline = 1_795_000_000.0
    reason = planned_reason(PlannedKind.MAINTENANCE, deadline + 0.7, 'ec2 system-reboot: "scheduled"\nreboot')
    assert reason == "[hpr-agent] Planned:Maintenance by 2026-11-18T11:06:40Z ec2 system-reboot: 'scheduled' reboot"
    assert iso_utc(deadline) == "2026-11-18T11:06:40Z"
    p = parse_planned(reason)
    assert p == PlannedReason(PlannedKind.MAINTENANCE, deadline, "ec2 system-reboot: 'scheduled' reboot")
    assert parse_reason(reason).owner == "agent" and parse_reason(reason).action is None


@pytest.mark.parametrize(
    "reason",
    [
        "Planned:Reclaim by 2026-11-18T08:26:40Z ec2",  # no tag: an operator's text
        "ops: [hpr-agent] Planned:Reclaim by 2026-11-18T08:26:40Z",  # the tag not first
        "[hpr-agent] Planned:Upgrade by 2026-11-18T08:26:40Z x",  # not a kind of ours
        "[hpr-agent] Planned:Reclaim by 2026-13-45T08:26:40Z x",  # no such date
        "[hpr-agent] Planned:Reclaim soon",
        "Action:Replace [hpr-agent] xid=79",
        "",
    ],
)
def test_only_the_agents_own_planned_reasons_parse_as_planned(reason: str) -> None:
    assert parse_planned(reason) is None
