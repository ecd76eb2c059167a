"""Which nodes the controller picks up, with which action and through which node group."""

from __future__ import annotations

import pytest

from hpresilience.controller.selection import first_rung, group_for, requested
from hpresilience.controller.settings import ControllerSettings, NodeGroup
from hpresilience.controller.state import RepairRecord
from hpresilience.controller.steps import came_back
from hpresilience.reasons import Action, PlannedKind, planned_reason
from hpresilience.slurm.models import Node

S = ControllerSettings()


def node(states: str, reason: str = "", **kw: object) -> Node:
    return Node(name="n1", address="10.0.0.1", hostname="n1", states=frozenset(states.split("+")), reason=reason, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "states, reason, action",
    [
        ("IDLE+FAIL", "Action:Replace", "replace"),
        ("ALLOCATED+FAIL", "Action:Replace [hpr-agent] xid=79", "replace"),  # failing: picked up, waited on later
        ("IDLE+DRAIN", "action:reboot by hand", "reboot"),
        ("DOWN", "Action:Reboot", "reboot"),
        ("IDLE+DRAIN", "Action:Replace [hpr-controller] repairing: replace (attempt 1)", "replace"),  # lost state dir
    ],
)
def test_action_requests_on_out_of_service_nodes_are_picked_up(states: str, reason: str, action: str) -> None:
    req = requested(node(states, reason), S)
    assert req is not None and req.action == action


@pytest.mark.parametrize(
    "states, reason",
    [
        ("IDLE", "Action:Replace"),  # in service: a stale reason asks nothing
        ("IDLE+DRAIN", "maintenance: new NIC firmware"),  # someone else's reason without an action
        ("IDLE+DRAIN", "[hpr-controller] needs a person: gave up after 3 attempt(s): ..."),
        ("IDLE+DRAIN+REBOOT_REQUESTED", "Action:Reboot"),  # Slurm is rebooting it already
        ("DOWN+NOT_RESPONDING", "Not responding"),  # down without reason: off by default
    ],
)
def test_nodes_not_for_us_are_left_alone(states: str, reason: str) -> None:
    assert requested(node(states, reason), S) is None


def test_reboot_leftovers_are_rebooted_unless_disabled() -> None:
    n = node("IDLE+DRAIN", "Reboot ASAP")
    req = requested(n, S)
    assert req is not None and req.action == "reboot" and req.grace_from is None
    assert requested(node("DOWN", "reboot timed out"), S) is not None
    assert requested(n, ControllerSettings(repair_reboot_leftovers=False)) is None


def test_down_without_reason_is_repaired_only_when_configured_with_a_grace_start() -> None:
    on = ControllerSettings(repair_down_without_reason=True)
    req = requested(node("DOWN+NOT_RESPONDING", "Not responding", reason_changed_at=1000), on)
    assert req is not None and req.action == "reboot" and req.grace_from == 1000
    assert requested(node("DOWN", "", reason_changed_at=None), on) is not None
    assert requested(node("DOWN", "power work by facilities"), on) is None
    assert requested(node("DOWN+DRAIN", ""), on) is None


def test_group_matching_hostlist_and_glob_first_wins() -> None:
    groups = [
        NodeGroup(name="p5", nodes=["gpu-[1-4,9]"], provider="ec2"),
        NodeGroup(name="rest", nodes=["gpu-*", "cpu-?"], provider="script"),
    ]
    assert group_for("gpu-9", groups) is groups[0]
    assert group_for("gpu-5", groups) is groups[1]
    assert group_for("cpu-1", groups) is groups[1]
    assert group_for("login-1", groups) is None


def test_requests_start_at_their_own_rung() -> None:
    assert first_rung([Action.REBOOT, Action.REPLACE, Action.REPLACE], Action.REBOOT) == 0
    assert first_rung([Action.REBOOT, Action.REPLACE, Action.REPLACE], Action.REPLACE) == 1
    assert first_rung([Action.REPLACE], Action.REBOOT) == 0


def test_came_back_needs_a_new_slurmd_or_boot_and_a_responding_node() -> None:
    rec = RepairRecord(
        node="n1", requested=Action.REBOOT, reason="", provider="x", detected_at=0, slurmd_before=100, boot_before=50
    )
    assert not came_back(node("IDLE+DRAIN", slurmd_start_time=100, boot_time=50), rec)
    assert came_back(node("IDLE+DRAIN", slurmd_start_time=160, boot_time=50), rec)
    assert came_back(node("DOWN+DRAIN", slurmd_start_time=100, boot_time=90), rec)
    assert not came_back(node("IDLE+DRAIN+NOT_RESPONDING", slurmd_start_time=160), rec)


@pytest.mark.parametrize("kind", list(PlannedKind))
def test_a_planned_drain_is_never_picked_up_for_repair(kind: PlannedKind) -> None:
    """Issue 25: the node is drained because the cloud takes it (reclaim) or maintains it; no repair of ours."""
    assert requested(node("IDLE+DRAIN", planned_reason(kind, 1_795_000_000, "ec2 spot terminate")), S) is None
