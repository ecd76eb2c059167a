"""Guard rails: repeats, ownership of reasons, escalation, the fleet ceiling, resume when clear."""

from __future__ import annotations

import pytest

from hpresilience.agent.guard import Decision, DecisionKind, FleetView, Memory, ceiling, decide, over_ceiling
from hpresilience.agent.settings import AgentSettings
from hpresilience.health.base import CheckResult, Kind, Status
from hpresilience.reasons import Action, agent_reason
from hpresilience.slurm.models import Node

NOW = 1_800_000_000.0


def node(name: str, states: set[str] | None = None, reason: str = "", changed: float | None = None) -> Node:
    return Node(
        name=name,
        address="",
        hostname="",
        states=frozenset(states or {"IDLE"}),
        reason=reason,
        reason_changed_at=int(changed) if changed else None,
    )


def fault(check: str, action: Action, reason: str, key: str = "", certain: bool = False) -> CheckResult:
    return CheckResult(check, "gpu", Kind.PASSIVE, Status.FAIL, action, reason, key=key, certain=certain)


XID79 = fault("xid", Action.REPLACE, "xid=79 GPU fell off the bus", "xid:79", certain=True)
ECC = fault("gpu.memory", Action.REPLACE, "uncorrected ECC 3", "gpu.ecc")
PENDING = fault("gpu.memory", Action.REBOOT, "row remap pending", "gpu.remap", certain=True)


def run(
    n: Node, findings: list[CheckResult], cluster: list[Node] | None = None, memory: Memory | None = None, **kw: object
) -> Decision:
    mem = memory or Memory()
    mem.observe(findings)
    cl = cluster if cluster is not None else [n] + [node(f"x{i}") for i in range(19)]
    return decide(n, cl, findings, mem, AgentSettings(**kw), NOW)  # type: ignore[arg-type]


def test_certain_fault_marks_at_once_with_reason_naming_it() -> None:
    d = run(node("n1"), [XID79])
    assert d.kind == "mark" and d.action == Action.REPLACE
    assert d.reason.startswith("Action:Replace [hpr-agent] xid: xid=79")
    assert d.finding is XID79


def test_uncertain_fault_needs_repeats() -> None:
    mem = Memory()
    assert run(node("n1"), [ECC], memory=mem).kind == "hold"
    assert run(node("n1"), [ECC], memory=mem).kind == "mark"


def test_streak_breaks_when_fault_disappears() -> None:
    mem = Memory()
    run(node("n1"), [ECC], memory=mem)
    run(node("n1"), [], memory=mem)
    assert run(node("n1"), [ECC], memory=mem).kind == "hold"


def test_operator_reason_is_never_overwritten() -> None:
    n = node("n1", {"IDLE", "DRAIN"}, "operator: bad fan")
    d = run(n, [XID79])
    assert d.kind == "hold" and "does not own" in d.why


def test_already_marked_is_not_marked_again_but_escalates() -> None:
    n = node("n1", {"IDLE", "FAIL"}, agent_reason(Action.REBOOT, "row remap pending"), NOW - 5)
    assert run(n, [PENDING]).kind == "none"
    d = run(n, [XID79])
    assert d.kind == "mark" and d.action == Action.REPLACE


def test_ceiling_holds_a_mark_while_a_tenth_of_the_partition_is_out_for_hpresilience() -> None:
    """20 nodes, 10 %: one node marked by an agent and one under repair by the controller -> the third is held,
    however long ago the others went out (a ceiling on how many are out, not a rate)."""
    others = [
        node("x0", {"IDLE", "FAIL"}, agent_reason(Action.REPLACE, "x"), NOW - 86400),
        node("x1", {"IDLE", "DRAIN"}, "[hpr-controller] repairing: reboot (attempt 1)", NOW - 7 * 86400),
    ]
    cluster = [node("n1")] + others + [node(f"y{i}") for i in range(17)]
    d = run(cluster[0], [XID79], cluster=cluster)
    assert d.kind == "hold" and d.held_by_ceiling and "fleet ceiling reached" in d.why and "x0, x1" in d.why
    # A node an operator drained is not ours: it does not count against the ceiling.
    mixed = [cluster[0], others[0], node("x1", {"IDLE", "DRAIN"}, "fan broken", NOW - 60), *cluster[3:]]
    assert run(cluster[0], [XID79], cluster=mixed).kind == "mark"


def test_a_node_left_for_a_person_counts_against_the_ceiling() -> None:
    lemon = node("x0", {"IDLE", "DRAIN"}, "hpr: needs a person: repaired 3 times within 7 d", NOW - 60)
    d = run(node("n1"), [XID79], cluster=[node("n1"), lemon, node("x2")], max_out_min=1)
    assert d.kind == "hold" and d.held_by_ceiling


def test_ceiling_has_a_floor() -> None:
    assert ceiling(4, AgentSettings()) == 1 and ceiling(100, AgentSettings()) == 10
    assert ceiling(4, AgentSettings(max_out_min=0)) == 0


def test_after_marking_only_the_marks_ahead_in_time_and_name_order_keep_theirs() -> None:
    """Two agents marked in the same second with room for one: the earlier name keeps its mark, the other backs
    out; a controller-held node is ahead of every agent mark."""
    a = node("a", {"IDLE", "FAIL"}, agent_reason(Action.REPLACE, "x"), NOW)
    b = node("b", {"IDLE", "FAIL"}, agent_reason(Action.REPLACE, "x"), NOW)
    rest = [node(f"y{i}") for i in range(8)]
    view = FleetView.of([a, b, *rest])
    s = AgentSettings()
    assert over_ceiling(view, "a", s, after_mark=True) is None
    assert over_ceiling(view, "b", s, after_mark=True) is not None
    held = node("c", {"IDLE", "DRAIN"}, "[hpr-controller] repairing", NOW + 5)
    assert over_ceiling(FleetView.of([a, held, *rest]), "a", AgentSettings(max_out_min=1), after_mark=True)


def test_resume_only_what_the_agent_marked() -> None:
    mine = node("n1", {"IDLE", "FAIL"}, agent_reason(Action.REBOOT, "x"), NOW - 5)
    assert run(mine, []).kind == "resume"
    assert run(mine, [], resume_when_clear=False).kind == "none"
    theirs = node("n1", {"IDLE", "FAIL"}, "Action:Replace", NOW - 5)
    assert run(theirs, []).kind == "none"


def test_operator_reason_quoting_the_agent_tag_is_not_resumed() -> None:
    """Issue 14 item 14: ownership was a substring match, so an operator's reason that merely mentions
    `[hpr-agent]` handed the node to the agent, which resumed it as soon as its own checks were clean."""
    for reason in (
        "maintenance: bad DIMM, do not trust [hpr-agent] here",
        "Action:Replace see ticket 12 [hpr-agent]",
        "operator [hpr-agent]",
    ):
        theirs = node("n1", {"IDLE", "DRAIN"}, reason, NOW - 5)
        assert run(theirs, []).kind == "none", reason
        assert run(theirs, [XID79]).kind == "hold", reason  # and never overwritten either


def test_results_that_ask_for_no_action_are_not_faults() -> None:
    """decide() takes a cycle's CheckResults as they come: a warning, an unknown, or a failure without an
    action neither marks nor counts toward a streak."""
    quiet = [
        CheckResult("gpu.pcie", "gpu", Kind.PASSIVE, Status.WARN, reason="x8"),
        CheckResult("ib.ports", "infiniband", Kind.PASSIVE, Status.UNKNOWN, reason="timed out"),
        fault("efa.count", Action.NONE, "2 of 4 EFA devices"),
    ]
    mem = Memory()
    assert run(node("n1"), quiet, memory=mem).kind is DecisionKind.NONE and mem.streaks == {}


def test_streaks_count_by_key_and_fall_back_to_the_check_name() -> None:
    mem = Memory()
    mem.observe([XID79, fault("gpu.count", Action.REBOOT, "7 GPUs")])
    assert mem.streaks == {"xid:79": 1, "gpu.count": 1}


def test_the_worst_fault_by_action_rank_decides_and_certainty_breaks_ties() -> None:
    d = run(node("n1"), [PENDING, XID79])
    assert (d.kind, d.action, d.finding) == (DecisionKind.MARK, Action.REPLACE, XID79)
    sure = fault("gpu.memory", Action.REPLACE, "remap failure", "gpu.remap_failure", certain=True)
    assert run(node("n1"), [ECC, sure]).finding is sure


@pytest.mark.parametrize(
    "kind,text",
    [
        (DecisionKind.MARK, "mark"),
        (DecisionKind.RESUME, "resume"),
        (DecisionKind.HOLD, "hold"),
        (DecisionKind.NONE, "none"),
        (DecisionKind.WOULD_MARK, "would_mark"),
    ],
)
def test_decision_kinds_keep_the_text_of_logs_and_metric_labels(kind: DecisionKind, text: str) -> None:
    assert kind.value == text and DecisionKind(text) is kind
    assert len(DecisionKind) == 5
