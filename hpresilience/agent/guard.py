"""Guard rails: turning one node's findings into a Slurm action, or deliberately into none.

Pure functions of (this node as Slurm sees it, the cluster's view for the cap, check results, memory of earlier
runs, settings, now). The cap view is passed as a function and called only when a mark is about to be made,
so a node with nothing to report asks Slurm nothing about the rest of the cluster. The rules, in order:
1. Never touch a node whose reason belongs to someone else (an operator, another tool, the controller).
2. Nothing to report: resume the node only if the agent marked it and `resume_when_clear` is on.
3. A fault (a check result asking for reboot or replace; the worst by the one rank, Action.rank) must
   repeat `required_repeats` runs in a row unless its check is certain.
4. A node already marked by us is re-marked only to escalate (reboot -> replace).
5. The fleet ceiling: nodes out of service for hpresilience's reasons (agent marks, controller repairs and
   nodes left for a person), this one included, must not exceed max(max_out_min, max_out_fraction * size)
   in any partition of the node. Agents do not talk to each other: Slurm is the shared counter.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpresilience.agent.settings import AgentSettings
from hpresilience.health.base import CheckResult
from hpresilience.health.verdict import worst
from hpresilience.reasons import Action, agent_reason, parse_planned, parse_reason
from hpresilience.slurm.models import Node, ReasonGroup


def fault_key(r: CheckResult) -> str:
    """Identifies the fault across runs, e.g. "xid:79:0000:53:00.0"; the check's name when it gave none."""
    return r.key or r.check


def fault_reason(r: CheckResult) -> str:
    """The detail of the Slurm reason: which check saw what."""
    return f"{r.check}: {r.reason}"


@dataclass
class Memory:
    """What the agent remembers between runs: consecutive sightings per fault key, and whether a mark of its
    own may be on the node (None: not known yet, e.g. after a restart; the node is read once to learn it)."""

    streaks: dict[str, int] = field(default_factory=dict)
    marked: bool | None = None

    def observe(self, results: Sequence[CheckResult]) -> None:
        """One cycle's results: a fault's streak grows when it is seen again, and ends when it is not."""
        seen = {fault_key(r) for r in results if r.asks_action}
        self.streaks = {k: self.streaks.get(k, 0) + 1 for k in seen}


class DecisionKind(str, enum.Enum):
    """What the guard decided; the value is the text of log lines, `--once` output and metric labels."""

    MARK = "mark"
    RESUME = "resume"
    HOLD = "hold"
    NONE = "none"
    # Observe mode: a fault the guard would have marked for; nothing was done (a label apart from "mark").
    WOULD_MARK = "would_mark"


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    why: str
    action: Action | None = None
    reason: str = ""
    # The check result that decided (the worst of those asking for an action), when there was one.
    finding: CheckResult | None = None
    # A hold because the fleet ceiling is reached: logged as a warning, counted apart, alerted on.
    held_by_ceiling: bool = False


@dataclass(frozen=True)
class FleetView:
    """What the fleet ceiling needs: the node's partitions grouped by reason (sizes and who is out), read from
    Slurm with one query (`SlurmClient.reason_groups`) only when a mark is about to be made."""

    groups: Sequence[ReasonGroup]

    @classmethod
    def of(cls, nodes: Sequence[Node]) -> FleetView:
        """From whole node records (tests, tools that already hold the table): one group per node."""
        return cls(
            [
                ReasonGroup(p, 1, (n.name,), n.reason if n.is_unavailable else "", n.reason_changed_at)
                for n in nodes
                for p in (n.partitions or ("",))
            ]
        )

    def partitions(self) -> dict[str, tuple[int, list[tuple[int, str, str]]]]:
        """partition -> (size, [(reason time, node, owner)] of the nodes out for hpresilience's reasons)."""
        out: dict[str, tuple[int, list[tuple[int, str, str]]]] = {}
        for g in self.groups:
            size, ours = out.get(g.partition, (0, []))
            owner = parse_reason(g.reason).owner if g.reason else None
            # A planned drain (a cloud notice) is not counted: the node goes whatever the agents decide, and
            # counting it would hold real fault marks during a reclaim wave (docs/agent.md).
            if owner is not None and parse_planned(g.reason) is None:
                ours = ours + [(g.reason_at or 0, n, owner) for n in g.nodes]
            out[g.partition] = (size + g.count, ours)
        return out


def ceiling(size: int, settings: AgentSettings) -> int:
    """How many of a partition's `size` nodes may be out of service for hpresilience at once."""
    return max(settings.max_out_min, math.floor(settings.max_out_fraction * size))


def over_ceiling(view: FleetView, node: str, settings: AgentSettings, after_mark: bool = False) -> str | None:
    """Why a mark of `node` would take a partition past its ceiling, or None. `after_mark`: our mark is in the
    view already; it stays only if the nodes ahead of it (every controller-held node, and agent marks earlier
    in (reason time, name) order: an order every agent computes alike) leave room for it."""
    for part, (size, ours) in sorted(view.partitions().items()):
        limit = ceiling(size, settings)
        if after_mark:
            mine = next(((t, n) for t, n, o in ours if n == node), None)
            ahead = [n for t, n, o in ours if n != node and (o != "agent" or mine is None or (t, n) < mine)]
        else:
            ahead = [n for _, n, _ in ours if n != node]
        if len(ahead) + 1 > limit:
            where = f"partition {part}" if part else "the cluster"
            shown = ", ".join(sorted(ahead)[:5]) + (", ..." if len(ahead) > 5 else "")
            return (
                f"fleet ceiling reached in {where}: {len(ahead)} node(s) already out of service for hpresilience "
                f"({shown}), ceiling {limit} of {size}"
            )
    return None


def decide(
    node: Node,
    cluster: Sequence[Node] | Callable[[], FleetView],
    results: Sequence[CheckResult],
    memory: Memory,
    settings: AgentSettings,
    now: float,
) -> Decision:
    """`results`: this cycle's check results; only those that ask for an action (a failure with action reboot
    or replace) count. `cluster`: every node, or a function returning the FleetView, called only for a new mark."""
    current = parse_reason(node.reason) if node.reason else None
    ours = current is not None and current.owner == "agent"
    planned = parse_planned(node.reason) is not None  # a cloud notice's drain: the notice lifts it, not a clear check
    foreign = node.reason != "" and not ours and node.is_unavailable
    findings = [r for r in results if r.asks_action]
    top = worst(findings) if findings else None

    if top is None:
        if ours and not planned and settings.resume_when_clear and node.is_unavailable:
            return Decision(DecisionKind.RESUME, "faults the agent reported have cleared")
        return Decision(DecisionKind.NONE, "healthy")
    if foreign:
        return Decision(
            DecisionKind.HOLD,
            f"node already out of service with a reason the agent does not own: {node.reason!r}",
            top.action,
            finding=top,
        )
    marked_as = current.action if current is not None and current.action is not None else Action.NONE
    if ours and marked_as.rank >= top.action.rank:
        word = marked_as.reason_word if marked_as is not Action.NONE else ""
        return Decision(DecisionKind.NONE, f"already marked {word} by the agent", top.action, finding=top)
    streak = memory.streaks.get(fault_key(top), 0)
    if not top.certain and streak < settings.required_repeats:
        return Decision(
            DecisionKind.HOLD,
            f"seen {streak} of {settings.required_repeats} runs in a row; waiting for a repeat",
            top.action,
            finding=top,
        )
    if not ours:
        view = cluster() if callable(cluster) else FleetView.of(cluster)
        why = over_ceiling(view, node.name, settings)
        if why is not None:
            return Decision(DecisionKind.HOLD, why, top.action, finding=top, held_by_ceiling=True)
    return Decision(
        DecisionKind.MARK,
        "escalating" if ours else "fault confirmed",
        top.action,
        agent_reason(top.action, fault_reason(top)),
        top,
    )
