"""The shared reason vocabulary: what operators type and what our parts write read back the same."""

from __future__ import annotations

import pytest

from hpresilience.reasons import Action, agent_reason, controller_reason, parse_reason


@pytest.mark.parametrize("reason,action,owner", [
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
])
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
