"""Guard rails: turning one node's findings into a Slurm action, or deliberately into none.

Pure functions of (this node as Slurm sees it, the cluster's view for the cap, check results, memory of earlier
runs, settings, now). The cap view is passed as a function and called only when a mark is about to be made,
so a node with nothing to report asks Slurm nothing about the rest of the cluster. The rules, in order:
1. Never touch a node whose reason belongs to someone else (an operator, another tool, the controller).
2. Nothing to report: resume the node only if the agent marked it and `resume_when_clear` is on.
3. A fault (a check result asking for reboot or replace; the worst by the one rank, Action.rank) must
   repeat `required_repeats` runs in a row unless its check is certain.
4. A node already marked by us is re-marked only to escalate (reboot -> replace).
5. The cluster-wide cap: nodes carrying an agent reason set within the window, this one included, must
   not exceed max(cap_min, cap_fraction * cluster size). Agents do not talk to each other: Slurm is
   the shared counter.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpresilience.agent.settings import AgentSettings
from hpresilience.health.base import CheckResult
from hpresilience.health.verdict import worst
from hpresilience.reasons import Action, agent_reason, parse_reason
from hpresilience.slurm.models import Node


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


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    why: str
    action: Action | None = None
    reason: str = ""
    # The check result that decided (the worst of those asking for an action), when there was one.
    finding: CheckResult | None = None


@dataclass(frozen=True)
class CapView:
    """What the cluster-wide cap needs: the cluster's size and its nodes out of service (agent marks are
    FAIL, so they are among them). Read from Slurm only when a mark is about to be made."""

    size: int
    out_of_service: Sequence[Node]

    @classmethod
    def of(cls, cluster: Sequence[Node]) -> CapView:
        return cls(len(cluster), [n for n in cluster if n.is_unavailable])


def cap_limit(cluster_size: int, settings: AgentSettings) -> int:
    return max(settings.cap_min, math.floor(settings.cap_fraction * cluster_size))


def recently_marked_by_agents(nodes: Sequence[Node], now: float, window_s: float) -> list[str]:
    out = []
    for n in nodes:
        if parse_reason(n.reason).owner == "agent" and n.is_unavailable:
            changed = n.reason_changed_at or 0
            if changed == 0 or now - changed <= window_s:
                out.append(n.name)
    return out


def decide(node: Node, cluster: Sequence[Node] | Callable[[], CapView], results: Sequence[CheckResult],
           memory: Memory, settings: AgentSettings, now: float) -> Decision:
    """`results`: this cycle's check results; only those that ask for an action (a failure with action reboot
    or replace) count. `cluster`: every node, or a function returning the CapView, called only for a new mark."""
    current = parse_reason(node.reason) if node.reason else None
    ours = current is not None and current.owner == "agent"
    foreign = node.reason != "" and not ours and node.is_unavailable
    findings = [r for r in results if r.asks_action]
    top = worst(findings) if findings else None

    if top is None:
        if ours and settings.resume_when_clear and node.is_unavailable:
            return Decision(DecisionKind.RESUME, "faults the agent reported have cleared")
        return Decision(DecisionKind.NONE, "healthy")
    if foreign:
        return Decision(DecisionKind.HOLD, f"node already out of service with a reason the agent does not own: "
                                           f"{node.reason!r}", top.action, finding=top)
    marked_as = current.action if current is not None and current.action is not None else Action.NONE
    if ours and marked_as.rank >= top.action.rank:
        word = marked_as.reason_word if marked_as is not Action.NONE else ""
        return Decision(DecisionKind.NONE, f"already marked {word} by the agent", top.action, finding=top)
    streak = memory.streaks.get(fault_key(top), 0)
    if not top.certain and streak < settings.required_repeats:
        return Decision(DecisionKind.HOLD, f"seen {streak} of {settings.required_repeats} runs in a row; waiting "
                                           f"for a repeat", top.action, finding=top)
    if not ours:
        view = cluster() if callable(cluster) else CapView.of(cluster)
        marked = [n for n in recently_marked_by_agents(view.out_of_service, now, settings.cap_window_s)
                  if n != node.name]
        limit = cap_limit(view.size, settings)
        if len(marked) + 1 > limit:
            return Decision(DecisionKind.HOLD, f"cluster cap reached: {len(marked)} node(s) already marked by agents "
                                               f"within {settings.cap_window_s:g} s, limit {limit} of {view.size}",
                            top.action, finding=top)
    return Decision(DecisionKind.MARK, "escalating" if ours else "fault confirmed", top.action,
                    agent_reason(top.action, fault_reason(top)), top)
