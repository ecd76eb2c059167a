"""What the agent does with a decision (agent/guard.py's `Decision`): the mark in Slurm and its lifting, the
fleet ceiling's roll-back after a mark, and observe mode's would-be marks; and the metrics they and the cycle count.

Functions of the Agent (agent/daemon.py) kept apart from its check cycle, like agent/planned.py: the cycle decides
(`guard.decide`), these write. Each write names this node only (`scontrol update nodename=<this node>`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hpresilience.agent.guard import Decision, DecisionKind, FleetView, Memory, fault_key, fault_reason, over_ceiling
from hpresilience.agent.settings import AgentSettings
from hpresilience.health.base import CheckResult
from hpresilience.log import get_logger
from hpresilience.reasons import Action, agent_reason
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node

log = get_logger("hpresilience.agent")


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.checks = Counter(
            "hpr_agent_check_results_total", "Check results by check and status", ["check", "status"], registry=registry
        )
        self.duration = Histogram(
            "hpr_agent_check_duration_seconds",
            "Check run time",
            ["check"],
            registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300),
        )
        self.decisions = Counter(
            "hpr_agent_decisions_total", "Guard-rail decisions", ["decision", "action"], registry=registry
        )
        self.latency = Histogram(
            "hpr_agent_fault_detection_latency_seconds",
            "From a fault being observed to the node marked in Slurm",
            registry=registry,
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
        )
        self.last_cycle = Gauge(
            "hpr_agent_last_cycle_timestamp_seconds", "End of the last check cycle", registry=registry
        )
        self.cycle_errors = Counter(
            "hpr_agent_cycle_errors_total", "Cycles that failed (Slurm unreachable, ...)", registry=registry
        )
        self.planned = Counter(
            "hpr_agent_planned_drains_total",
            "Nodes drained (or, observing, that would have been) for a cloud notice",
            ["kind", "decision"],
            registry=registry,
        )
        self.ceiling_holds = Counter(
            "hpr_agent_ceiling_holds_total",
            "Marks held (or rolled back) because the fleet ceiling of nodes out of service "
            "for hpresilience was reached",
            ["action"],
            registry=registry,
        )


class Agent(Protocol):
    """What of the agent (agent/daemon.py's Agent) a decision needs: named here, so that this module does not
    import the daemon that imports it."""

    @property
    def settings(self) -> AgentSettings: ...
    @property
    def client(self) -> SlurmClient: ...
    @property
    def node_name(self) -> str: ...
    @property
    def metrics(self) -> AgentMetrics: ...
    @property
    def memory(self) -> Memory: ...
    def fleet_view(self, me: Node) -> FleetView: ...


def action_label(d: Decision) -> str:
    """The action as log lines and the decisions metric have always spelt it: "Replace", "Reboot", "none"."""
    return d.action.reason_word if d.action is not None and d.action is not Action.NONE else "none"


def note_observed(agent: Agent, results: Sequence[CheckResult]) -> Decision | None:
    """Faults of observed checks: at the cycle where the guard would have marked (a certain fault at once,
    another at its `required_repeats`-th run in a row) log it and count decision="would_mark" - never a
    mark. The worst such fault is returned as the cycle's decision when nothing else is decided."""
    due = [
        r
        for r in results
        if r.asks_action
        and agent.memory.streaks.get(fault_key(r), 0) == (1 if r.certain else agent.settings.required_repeats)
    ]
    out: Decision | None = None
    for r in sorted(due, key=lambda r: -r.action.rank):
        d = Decision(
            DecisionKind.WOULD_MARK,
            "observe mode: fault confirmed, node not marked",
            r.action,
            agent_reason(r.action, fault_reason(r)),
            r,
        )
        agent.metrics.decisions.labels(d.kind.value, action_label(d)).inc()
        log.warning(
            "node_would_be_marked_fail",
            node=agent.node_name,
            reason=d.reason,
            check=r.check,
            finding=fault_reason(r),
            mode="observe",
        )
        out = out or d
    return out


def verify_ceiling(agent: Agent, me: Node, d: Decision) -> Decision:
    """Agents that see the same fault in the same second all pass the ceiling before any of them marked.
    So each re-reads Slurm after marking and keeps its mark only if the nodes ahead of it (controller-held
    ones, and agent marks earlier in (reason time, name) order, an order every agent computes the same)
    leave room for it; else it backs out."""
    why = over_ceiling(agent.fleet_view(me), agent.node_name, agent.settings, after_mark=True)
    if why is None:
        return d
    agent.client.set_node_state([agent.node_name], "resume")
    agent.memory.marked = False
    log.warning("node_mark_rolled_back", node=agent.node_name, why=why)
    agent.metrics.decisions.labels("rolled_back", action_label(d)).inc()
    agent.metrics.ceiling_holds.labels(action_label(d)).inc()
    return Decision(DecisionKind.HOLD, why, d.action, finding=d.finding, held_by_ceiling=True)


def apply(agent: Agent, node: Node, d: Decision, results: Sequence[CheckResult]) -> None:
    """Carry out the guard's decision on this node: mark it, resume it, or log why a fault was held."""
    action = action_label(d)
    agent.metrics.decisions.labels(d.kind.value, action).inc()
    evidence = {
        "checks": {r.check: r.status.value for r in results},
        "finding": fault_reason(d.finding) if d.finding else None,
        "check": d.finding.check if d.finding else None,
    }
    if d.kind is DecisionKind.MARK:
        agent.client.set_node_state([node.name], "fail", d.reason)
        agent.memory.marked = True
        if d.finding is not None and d.finding.observed_at:
            agent.metrics.latency.observe(max(0.0, time.time() - d.finding.observed_at))
        log.warning("node_marked_fail", node=node.name, reason=d.reason, why=d.why, **evidence)
    elif d.kind is DecisionKind.RESUME:
        agent.client.set_node_state([node.name], "resume")
        agent.memory.marked = False
        log.info("node_resumed", node=node.name, why=d.why, previous_reason=node.reason)
    elif d.kind is DecisionKind.HOLD and d.held_by_ceiling:
        agent.metrics.ceiling_holds.labels(action).inc()
        log.warning("node_mark_held_ceiling", node=node.name, why=d.why, action=action, **evidence)
    elif d.kind is DecisionKind.HOLD:
        log.info("verdict_held", node=node.name, why=d.why, action=action, **evidence)
