"""Taking this node out of scheduling for the active checks, and putting it back.

Stress tests, DCGM diag and EFA loopback load the whole node: a job that lands mid-test shares it with them
(and a diag failure would mark the node under that job). So before they run, an idle node is drained under
the agent's own reason, `[hpr-agent] active health checks running` (no Action: word: the controller never
repairs it), and read again: a job that slipped in between the look and the drain cancels the run. After the
checks the node is resumed only if that reason is still on it; a mark the same cycle decided replaces it.
A node someone else drained or reserved is never held (the agent only acts on an idle node or its own mark).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger
from hpresilience.reasons import AGENT_TAG, parse_reason
from hpresilience.slurm import reservations
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node

log = get_logger("hpresilience.agent")
HOLD_REASON = f"{AGENT_TAG} active health checks running"


@dataclass
class Hold:
    """`taken`: the agent drained the node for the checks (and must put it back)."""

    taken: bool


def is_hold(node: Node) -> bool:
    return node.reason.strip() == HOLD_REASON


def as_before(node: Node) -> Node:
    """The node as it was before the agent held it: what the guard rails judge (a hold is not a mark)."""
    if not is_hold(node):
        return node
    return replace(node, reason="", states=node.states - {"DRAIN"})


def take(client: SlurmClient, node: Node) -> Hold | None:
    """Keep jobs off `node` for the active checks; None when they must not run now."""
    if is_hold(node) or (parse_reason(node.reason).owner == "agent" and node.is_unavailable and not node.is_busy):
        # Already out of scheduling by the agent's hand: a hold left by a stopped agent, or its own mark.
        return Hold(taken=is_hold(node))
    if not node.is_idle:
        return None
    reserved = reservations.active_reservations_on(client, node.name)
    if reserved:
        log.info("active_checks_skipped", node=node.name, why=f"node reserved ({', '.join(reserved)})")
        return None
    client.set_node_state([node.name], "drain", HOLD_REASON)
    now = client.node(node.name)
    if now.is_busy or not is_hold(now):
        # A job started between the look and the drain (or someone changed the node meanwhile): not now.
        give_back(client, node.name)
        log.info("active_checks_skipped", node=node.name, why=f"node changed while being held ({now.state_text})")
        return None
    log.info("node_held_for_active_checks", node=node.name, reason=HOLD_REASON)
    return Hold(taken=True)


def give_back(client: SlurmClient, name: str) -> bool:
    """Resume the node if the hold is still ours; a reason anyone (or this cycle's mark) set meanwhile stays."""
    try:
        now = client.node(name)
        if not is_hold(now):
            return False
        client.set_node_state([name], "resume")
    except HPResilienceError as err:  # left held; the next cycle's look sees our reason and gives it back
        log.error("node_hold_not_released", node=name, error=str(err)[:300])
        return False
    log.info("node_released_after_active_checks", node=name)
    return True
