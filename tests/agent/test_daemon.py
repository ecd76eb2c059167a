"""One agent cycle over CheckResults, against a stand-in for Slurm: the decision, the mark it writes, and the
texts of its metric labels (dashboards and alerts read "mark"/"Replace")."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from hpresilience.agent.daemon import Agent
from hpresilience.agent.guard import DecisionKind
from hpresilience.agent.settings import AgentSettings
from hpresilience.health.base import CheckResult, Kind, Status
from hpresilience.reasons import Action
from hpresilience.slurm.models import Node, ReasonGroup

XID = CheckResult(
    "xid",
    "xid",
    Kind.PASSIVE,
    Status.FAIL,
    Action.REPLACE,
    "XID 79 (fallen off the bus)",
    key="nvidia:79:0000:53:00",
    certain=True,
)
OK = CheckResult("gpu.count", "gpu", Kind.PASSIVE, Status.OK, reason="8 GPU(s) present")


class Slurm:
    """The three calls the agent makes, over one node in a partition of `size` nodes."""

    def __init__(self, size: int = 10) -> None:
        self.me = Node(name="n1", address="", hostname="", states=frozenset({"IDLE"}))
        self.size = size
        self.updates: list[tuple[list[str], str, str]] = []

        self.calls: list[str] = []

    def node(self, name: str) -> Node:
        self.calls.append("node")
        return self.me

    def reason_groups(self, partitions: Iterable[str] = ()) -> list[ReasonGroup]:
        self.calls.append("reason_groups")
        me = ReasonGroup("p", 1, ("n1",), self.me.reason if self.me.is_unavailable else "", self.me.reason_changed_at)
        return [me, ReasonGroup("p", self.size - 1, tuple(f"x{i}" for i in range(self.size - 1)))]

    def set_node_state(self, names: Iterable[str], action: str, reason: str = "") -> None:
        self.calls.append("set_node_state")
        self.updates.append((list(names), action, reason))
        states = {"fail": {"IDLE", "FAIL"}, "resume": {"IDLE"}}[action]
        self.me = replace(self.me, states=frozenset(states), reason=reason, reason_changed_at=int(time.time()))


class Checks:
    def __init__(self, results: Sequence[CheckResult]) -> None:
        self.results = list(results)

    def passive(self) -> Sequence[CheckResult]:
        return self.results

    def active(self) -> Sequence[CheckResult]:
        return []

    def wait_event(self, timeout: float) -> bool:
        return False


def agent(tmp_path: Path, checks: Checks, slurm: Slurm, **kw: object) -> Agent:
    settings = AgentSettings(node_name="n1", state_dir=str(tmp_path), metrics_address="", active_checks=False, **kw)  # type: ignore[arg-type]
    return Agent(settings, slurm, checks)  # type: ignore[arg-type]


def sample(a: Agent, name: str, **labels: str) -> float:
    value = a.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_failing_check_result_marks_the_node_and_labels_keep_their_text(tmp_path: Path) -> None:
    observed = time.time() - 2.0
    slurm = Slurm()
    a = agent(tmp_path, Checks([OK, replace(XID, observed_at=observed)]), slurm)
    d = a.cycle()
    assert d.kind is DecisionKind.MARK and d.finding is not None and d.finding.check == "xid"
    [(names, state, reason)] = slurm.updates
    assert (names, state) == (["n1"], "fail")
    assert reason.startswith("Action:Replace [hpr-agent] xid: XID 79 (fallen off the bus)")
    assert sample(a, "hpr_agent_decisions_total", decision="mark", action="Replace") == 1
    assert sample(a, "hpr_agent_check_results_total", check="xid", status="fail") == 1
    assert sample(a, "hpr_agent_check_results_total", check="gpu.count", status="ok") == 1
    # Detection latency runs from the deciding result's observed_at to the mark.
    assert sample(a, "hpr_agent_fault_detection_latency_seconds_count") == 1
    assert sample(a, "hpr_agent_fault_detection_latency_seconds_sum") >= 2.0


def test_results_asking_for_nothing_ask_slurm_nothing_once_no_mark_is_out(tmp_path: Path) -> None:
    warn = CheckResult("gpu.pcie", "gpu", Kind.PASSIVE, Status.WARN, reason="x8")
    slurm = Slurm()
    a = agent(tmp_path, Checks([OK, warn]), slurm)
    a.memory.marked = False
    assert a.cycle().kind is DecisionKind.NONE and slurm.updates == []
    assert sample(a, "hpr_agent_decisions_total", decision="none", action="none") == 1


def test_observe_mode_counts_would_mark_apart_and_runs_no_slurm_command(tmp_path: Path) -> None:
    """agent.mode observe: a certain fault is logged and counted as decision="would_mark" (never as "mark"),
    once per streak, and the agent neither reads nor writes Slurm."""
    slurm = Slurm()
    a = agent(tmp_path, Checks([OK, XID]), slurm, mode="observe")
    d = a.cycle()
    assert d.kind is DecisionKind.WOULD_MARK and d.reason.startswith("Action:Replace [hpr-agent] xid:")
    a.cycle()
    assert slurm.calls == [] and slurm.updates == []
    assert sample(a, "hpr_agent_decisions_total", decision="would_mark", action="Replace") == 1
    assert sample(a, "hpr_agent_decisions_total", decision="mark", action="Replace") == 0


def test_dry_run_is_observe_mode(tmp_path: Path) -> None:
    slurm = Slurm()
    a = agent(tmp_path, Checks([XID]), slurm, dry_run=True)
    assert a.cycle().kind is DecisionKind.WOULD_MARK and slurm.calls == []
    assert sample(a, "hpr_agent_decisions_total", decision="mark", action="Replace") == 0


class ObservedChecks(Checks):
    observe_only = frozenset({"xid"})


def test_a_check_in_observe_mode_is_counted_not_acted_on_while_the_others_enforce(tmp_path: Path) -> None:
    slurm = Slurm()
    a = agent(tmp_path, ObservedChecks([XID]), slurm)
    a.memory.marked = False
    assert a.cycle().kind is DecisionKind.WOULD_MARK and slurm.updates == []
    assert sample(a, "hpr_agent_decisions_total", decision="would_mark", action="Replace") == 1
    ecc = CheckResult(
        "gpu.memory", "gpu", Kind.PASSIVE, Status.FAIL, Action.REPLACE, "uncorrected ECC", key="gpu.ecc", certain=True
    )
    b = agent(tmp_path / "b", ObservedChecks([XID, ecc]), slurm)
    assert b.cycle().kind is DecisionKind.MARK and "gpu.memory" in slurm.updates[-1][2]


def test_a_mark_over_the_fleet_ceiling_is_held_counted_and_not_applied(tmp_path: Path) -> None:
    """A partition of 10 nodes, ceiling 1: one node already out for hpresilience -> this mark is held."""
    slurm = Slurm(size=10)
    other = ReasonGroup("p", 1, ("x0",), "[hpr-controller] repairing: reboot", int(time.time()))
    slurm.reason_groups = lambda partitions=(): [  # type: ignore[method-assign]
        other,
        ReasonGroup("p", 9, ("n1", *(f"x{i}" for i in range(1, 9)))),
    ]
    a = agent(tmp_path, Checks([XID]), slurm)
    d = a.cycle()
    assert d.kind is DecisionKind.HOLD and d.held_by_ceiling and slurm.updates == []
    assert sample(a, "hpr_agent_ceiling_holds_total", action="Replace") == 1
