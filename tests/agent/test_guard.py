"""Guard rails: repeats, ownership of reasons, escalation, the cluster-wide cap, resume when clear."""

from __future__ import annotations

import pytest

from hpresilience.agent.guard import Decision, DecisionKind, Memory, cap_limit, decide
from hpresilience.agent.settings import AgentSettings
from hpresilience.health.base import CheckResult, Kind, Status
from hpresilience.reasons import Action, agent_reason
from hpresilience.slurm.models import Node

NOW = 1_800_000_000.0


def node(name: str, states: set[str] | None = None, reason: str = "", changed: float | None = None) -> Node:
    return Node(name=name, address="", hostname="", states=frozenset(states or {"IDLE"}), reason=reason,
                reason_changed_at=int(changed) if changed else None)


def fault(check: str, action: Action, reason: str, key: str = "", certain: bool = False) -> CheckResult:
    return CheckResult(check, "gpu", Kind.PASSIVE, Status.FAIL, action, reason, key=key, certain=certain)


XID79 = fault("xid", Action.REPLACE, "xid=79 GPU fell off the bus", "xid:79", certain=True)
ECC = fault("gpu.memory", Action.REPLACE, "uncorrected ECC 3", "gpu.ecc")
PENDING = fault("gpu.memory", Action.REBOOT, "row remap pending", "gpu.remap", certain=True)


def run(n: Node, findings: list[CheckResult], cluster: list[Node] | None = None, memory: Memory | None = None,
        **kw: object) -> Decision:
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


def test_cap_stops_a_check_that_fails_everywhere() -> None:
    """20 nodes, 10 %: two already marked by agents in the window -> the third is held."""
    others = [node(f"x{i}", {"IDLE", "FAIL"}, agent_reason(Action.REPLACE, "x"), NOW - 60) for i in range(2)]
    cluster = [node("n1")] + others + [node(f"y{i}") for i in range(17)]
    d = run(cluster[0], [XID79], cluster=cluster)
    assert d.kind == "hold" and "cap reached" in d.why
    # Marks older than the window no longer count.
    old = [node(f"x{i}", {"IDLE", "FAIL"}, agent_reason(Action.REPLACE, "x"), NOW - 3600) for i in range(2)]
    assert run(cluster[0], [XID79], cluster=[cluster[0], *old, *cluster[3:]]).kind == "mark"


def test_cap_limit_has_a_floor() -> None:
    assert cap_limit(4, AgentSettings()) == 1 and cap_limit(100, AgentSettings()) == 10
    assert cap_limit(4, AgentSettings(cap_min=0)) == 0


def test_resume_only_what_the_agent_marked() -> None:
    mine = node("n1", {"IDLE", "FAIL"}, agent_reason(Action.REBOOT, "x"), NOW - 5)
    assert run(mine, []).kind == "resume"
    assert run(mine, [], resume_when_clear=False).kind == "none"
    theirs = node("n1", {"IDLE", "FAIL"}, "Action:Replace", NOW - 5)
    assert run(theirs, []).kind == "none"


def test_operator_reason_quoting_the_agent_tag_is_not_resumed() -> None:
    """Issue 14 item 14: ownership was a substring match, so an operator's reason that merely mentions
    `[hpr-agent]` handed the node to the agent, which resumed it as soon as its own checks were clean."""
    for reason in ("maintenance: bad DIMM, do not trust [hpr-agent] here",
                   "Action:Replace see ticket 12 [hpr-agent]",
                   "operator [hpr-agent]"):
        theirs = node("n1", {"IDLE", "DRAIN"}, reason, NOW - 5)
        assert run(theirs, []).kind == "none", reason
        assert run(theirs, [XID79]).kind == "hold", reason  # and never overwritten either


def test_results_that_ask_for_no_action_are_not_faults() -> None:
    """decide() takes a cycle's CheckResults as they come: a warning, an unknown, or a failure without an
    action neither marks nor counts toward a streak."""
    quiet = [CheckResult("gpu.pcie", "gpu", Kind.PASSIVE, Status.WARN, reason="x8"),
             CheckResult("ib.ports", "infiniband", Kind.PASSIVE, Status.UNKNOWN, reason="timed out"),
             fault("efa.count", Action.NONE, "2 of 4 EFA devices")]
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


@pytest.mark.parametrize("kind,text", [(DecisionKind.MARK, "mark"), (DecisionKind.RESUME, "resume"),
                                       (DecisionKind.HOLD, "hold"), (DecisionKind.NONE, "none")])
def test_decision_kinds_keep_the_text_of_logs_and_metric_labels(kind: DecisionKind, text: str) -> None:
    assert kind.value == text and DecisionKind(text) is kind
    assert len(DecisionKind) == 4
