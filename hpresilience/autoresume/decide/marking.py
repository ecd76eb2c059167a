"""Marking a node out of service from the wrapper: the one place where a verdict's mark request is carried out.

A detector never marks a node itself (watch/base.py): its verdict names the nodes and asks for a mark
(`MarkRequest`: the action, why, the evidence). After the step, the decisions carry it out here, as one
`scontrol update node=N state=fail reason="Action:... [hpr-autoresume job J] why evidence=..."` per node, the
reason in the grammar the controller acts on (reasons.py). The wrapper runs as the job's user: on a cluster where
users may not update nodes the mark is refused, the refusal is an event, and the node is still swapped out of the
step (the verdict's blame does not depend on the mark).
"""

from __future__ import annotations

from collections.abc import Sequence

from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.base import MarkRequest
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient

REASON_MAX = 400


def mark_reason(job_id: int, request: MarkRequest) -> str:
    """The node's reason: the action first (the controller's grammar), our tag, why, and where the evidence is."""
    reason = (
        f"Action:{request.action.reason_word} [hpr-autoresume job {job_id}] {request.why} evidence={request.evidence}"
    )
    return reason.replace('"', "'")[:REASON_MAX]


def mark_nodes(
    client: SlurmClient, reporter: Reporter, job_id: int, nodes: Sequence[str], request: MarkRequest
) -> list[str]:
    """Mark each node as the request asks; the nodes marked."""
    reason = mark_reason(job_id, request)
    marked: list[str] = []
    for node in nodes:
        try:
            client.set_node_state([node], "fail", reason)
        except HPResilienceError as err:
            reporter.decision(f"{request.event}_failed", node=node, error=str(err)[:300])
            continue
        reporter.decision(request.event, node=node, action=request.action.value, reason=reason)
        marked.append(node)
    return marked
