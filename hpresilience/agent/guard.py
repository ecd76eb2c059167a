"""Guard rails: turning one node's findings into a Slurm action, or deliberately into none.

Pure functions of (this node as Slurm sees it, the cluster's view for the cap, findings, memory of earlier
runs, settings, now). The cap view is passed as a function and called only when a mark is about to be made,
so a node with nothing to report asks Slurm nothing about the rest of the cluster. The rules, in order:
1. Never touch a node whose reason belongs to someone else (an operator, another tool, the controller).
2. Nothing to report: resume the node only if the agent marked it and `resume_when_clear` is on.
3. A finding must repeat `required_repeats` runs in a row unless its check is certain.
4. A node already marked by us is re-marked only to escalate (reboot -> replace).
5. The cluster-wide cap: nodes carrying an agent reason set within the window, this one included, must
   not exceed max(cap_min, cap_fraction * cluster size). Agents do not talk to each other: Slurm is
   the shared counter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpresilience.agent.settings import AgentSettings
from hpresilience.reasons import Action, agent_reason, parse_reason
from hpresilience.slurm.models import Node

SEVERITY = {None: 0, Action.REBOOT: 1, Action.REPLACE: 2}


@dataclass(frozen=True)
class Finding:
    """One fault worth acting on, as reported by a check."""

    key: str  # identifies the fault across runs, e.g. "xid:79" or "nvml.remapped_rows"
    action: Action
    reason: str
    certain: bool = False
    check: str = ""


@dataclass
class Memory:
    """What the agent remembers between runs: consecutive sightings per fault key, and whether a mark of its
    own may be on the node (None: not known yet, e.g. after a restart; the node is read once to learn it)."""

    streaks: dict[str, int] = field(default_factory=dict)
    marked: bool | None = None

    def observe(self, findings: Sequence[Finding]) -> None:
        seen = {f.key for f in findings}
        self.streaks = {k: self.streaks.get(k, 0) + 1 for k in seen}


@dataclass(frozen=True)
class Decision:
    kind: str  # "mark", "resume", "hold", "none"
    why: str
    action: Action | None = None
    reason: str = ""
    finding: Finding | None = None


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


def decide(node: Node, cluster: Sequence[Node] | Callable[[], CapView], findings: Sequence[Finding],
           memory: Memory, settings: AgentSettings, now: float) -> Decision:
    """`cluster`: every node, or a function returning the CapView, called only for a new mark."""
    current = parse_reason(node.reason) if node.reason else None
    ours = current is not None and current.owner == "agent"
    foreign = node.reason != "" and not ours and node.is_unavailable
    worst = max(findings, key=lambda f: (SEVERITY[f.action], f.certain), default=None)

    if worst is None:
        if ours and settings.resume_when_clear and node.is_unavailable:
            return Decision("resume", "faults the agent reported have cleared")
        return Decision("none", "healthy")
    if foreign:
        return Decision("hold", f"node already out of service with a reason the agent does not own: {node.reason!r}",
                        worst.action, finding=worst)
    if ours and current is not None and SEVERITY[current.action] >= SEVERITY[worst.action]:
        return Decision("none", f"already marked {current.action.value if current.action else ''} by the agent",
                        worst.action, finding=worst)
    streak = memory.streaks.get(worst.key, 0)
    if not worst.certain and streak < settings.required_repeats:
        return Decision("hold", f"seen {streak} of {settings.required_repeats} runs in a row; waiting for a repeat",
                        worst.action, finding=worst)
    if not ours:
        view = cluster() if callable(cluster) else CapView.of(cluster)
        marked = [n for n in recently_marked_by_agents(view.out_of_service, now, settings.cap_window_s)
                  if n != node.name]
        limit = cap_limit(view.size, settings)
        if len(marked) + 1 > limit:
            return Decision("hold", f"cluster cap reached: {len(marked)} node(s) already marked by agents within "
                                    f"{settings.cap_window_s:g} s, limit {limit} of {view.size}",
                            worst.action, finding=worst)
    return Decision("mark", "escalating" if ours else "fault confirmed", worst.action,
                    agent_reason(worst.action, worst.reason), worst)
