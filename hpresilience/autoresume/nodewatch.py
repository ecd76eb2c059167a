"""Which of the step's nodes were marked bad, at a cost that does not grow with the cluster.

Reading node state costs slurmctld its whole node table (~10 ms at 10,000 nodes, whatever the filter); reading
the job costs the job (~0.3 ms). So each poll reads only the job's own record, where the controller writes the
bad nodes under the job (AdminComment, slurm/notice.py). Only when that notice names a node of the step with
a mark this wrapper has not acted on yet are the step's nodes read by name, to confirm the fault and to report
the node's state and reason. Where no controller runs, the step's nodes are also read every
full_node_check_s (a slower detection, at 1/full_node_check_s of the node table's cost per second).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.slurm.notice import leaves_step, planned_move, read_notice

log = get_logger("hpresilience.autoresume")


class NodeWatch:
    def __init__(self, client: SlurmClient, job_id: int, full_check_s: float = 120.0) -> None:
        self.client = client
        self.job_id = job_id
        self.full_check_s = full_check_s
        self.acted: dict[str, int] = {}  # node -> the mark time already looked at (a later mark is news)
        self.next_full = time.monotonic() + full_check_s if full_check_s > 0 else float("inf")

    def bad_nodes(self, step_nodes: Sequence[str]) -> list[Node]:
        """The step's nodes that must leave it, confirmed against their own state; [] when slurmctld does
        not answer (an unanswering slurmctld is neither a healthy verdict nor a reason to kill a step)."""
        now = time.monotonic()
        try:
            notice = read_notice(self.client, self.job_id)
        except HPResilienceError as err:
            log.warning("slurm_poll_failed", error=str(err)[:300])
            return []
        news = {n: t for n, t in notice.bad.items() if n in step_nodes and self.acted.get(n) != t}
        if not news and now < self.next_full:
            return []
        if now >= self.next_full:
            self.next_full = now + self.full_check_s
        try:
            nodes = self.client.known_nodes(list(step_nodes))
        except HPResilienceError as err:
            log.warning("slurm_poll_failed", error=str(err)[:300])
            return []
        self.acted.update(news)
        return [n for n in nodes if leaves_step(n) or planned_move(n)]
