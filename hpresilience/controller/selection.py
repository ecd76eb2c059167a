"""Which nodes the controller repairs, with which action, through which node group.

Pure functions over the nodes of one Slurm query (the nodes out of service, see loop.py). Each node's reason is
parsed once per query (`look`): every decision of the cycle (the events, the fleet's counts, a pick-up, a repair's
step) reads that one `Look`.
A node is picked up when it is out of service (FAIL, DOWN or DRAIN, failing or draining included) and
 - its reason is an `Action:Replace` / `Action:Reboot` request (from the agent, an operator or us), or
 - `scontrol reboot` left it behind (reason "Reboot ASAP" or "reboot timed out") - if so configured, or
 - it is DOWN with no reason or only one of Slurm's own, for `down_grace_s` - if so configured.
A reason someone else wrote without an `Action:` word (maintenance, a site tool) is never touched.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from hpresilience.controller.settings import ControllerSettings, NodeGroup
from hpresilience.reasons import Action, ParsedReason, parse_reason
from hpresilience.slurm.hostlist import expand
from hpresilience.slurm.models import Node

OUT_OF_SERVICE = frozenset({"FAIL", "DOWN", "DRAIN"})
# Slurm is rebooting it right now: acting again would only restart the reboot.
REBOOTING = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERING_UP", "POWERING_DOWN"})
REBOOT_LEFTOVERS = ("reboot asap", "reboot timed out")


@dataclass(frozen=True)
class Request:
    action: Action  # reboot | replace
    why: str
    # Set for a node down without a reason: repair only once it has stayed so for `down_grace_s` from here
    # (Slurm's reason time when it has one, else 0 and the loop counts from when it first saw the node).
    grace_from: float | None = None


@dataclass(frozen=True)
class Look:
    """One node of a snapshot with its reason parsed (reasons.py has the grammar) and what it asks of us."""

    node: Node
    reason: ParsedReason
    request: Request | None

    @property
    def in_service(self) -> bool:
        return not self.node.states & OUT_OF_SERVICE


def look(node: Node, settings: ControllerSettings) -> Look:
    """The one parse of a node's reason in a cycle."""
    parsed = parse_reason(node.reason)
    return Look(node, parsed, requested(node, settings, parsed))


def requested(node: Node, settings: ControllerSettings, parsed: ParsedReason | None = None) -> Request | None:
    """What the node's state and reason ask of the controller, or None. `parsed`: its reason, parsed already."""
    if not node.states & OUT_OF_SERVICE or node.states & REBOOTING:
        return None
    parsed = parse_reason(node.reason) if parsed is None else parsed
    if parsed.action is not None:
        who = parsed.owner or "operator"
        return Request(
            parsed.action, f"Action:{parsed.action.reason_word} set by {who} ({node.reason_set_by or 'unknown user'})"
        )
    if parsed.owner is not None:
        return None  # our own or the agent's reason without an action: nothing asked of us
    low = node.reason.strip().lower()
    if settings.repair_reboot_leftovers and low.startswith(REBOOT_LEFTOVERS):
        return Request(Action.REBOOT, f"left behind by scontrol reboot ({node.reason.strip()!r})")
    if (
        settings.repair_down_without_reason
        and "DOWN" in node.states
        and "DRAIN" not in node.states
        and node.reason.strip() in settings.down_reasons
    ):
        return Request(Action.REBOOT, f"down with reason {node.reason.strip()!r}", float(node.reason_changed_at or 0))
    return None


@lru_cache(maxsize=256)
def _expanded(pattern: str) -> frozenset[str]:
    return frozenset(expand(pattern))


def _matches(name: str, pattern: str) -> bool:
    if "[" in pattern:
        return name in _expanded(pattern)
    return fnmatch.fnmatchcase(name, pattern)


def group_for(node: str, groups: list[NodeGroup]) -> NodeGroup | None:
    """The first group whose patterns match the node (config order); None: the default provider."""
    for g in groups:
        if any(_matches(node, p) for p in g.nodes):
            return g
    return None


def first_rung(ladder: Sequence[Action], action: Action) -> int:
    """A request starts at the first rung of its own action (the settings guarantee a replace rung)."""
    return ladder.index(action) if action in ladder else ladder.index(Action.REPLACE)
