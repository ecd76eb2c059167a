"""Keeping the hot spares the job asked for (in-process mode): a spare spent on a replacement is made good, between
faults, by a node this job released, once that node is back in service and idle.

With `--auto-resume-spares=1` the first fault is replaced by the spare's warm standby in under a second; without a
refill every later fault finds no spare and waits for a grow and a cold start (a Python start, `import torch`, the
model built: 20-40 s on a loaded machine, the bulk of a cold recovery). On a cluster that repairs nodes (the
controller, or HyperPod's replacement under the same name) the failed node comes back idle minutes later: taking it
back into the job as the new spare, with a standby started on it, makes the next fault as cheap as the first.

Only the nodes this job released are looked at, by name (their number is the job's faults, not the cluster's
size): one read of the job and one of those nodes every REFILL_EVERY_S while a spare is missing and one of them
could come back. Other idle nodes of the partition are not sought between faults (finding one reads the partition's
node table); a fault still grows into any of them (capacity.py). A node that left the job unanswering is not taken
back as a spare: slurmctld ends the job on it once it answers again, killing any step of the job there, so it
comes back only as a replacement at a fault, which the loop's rejoin handling covers (inprocess.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from hpresilience.autoresume.decide.capacity import Capacity
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.nodewatch import node_is_bad
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.hostlist import compress
from hpresilience.slurm.models import Node

# Between looks while a spare is missing: the node comes back after a repair (minutes), so a few seconds of delay
# cost nothing, and each look is two small reads sized by this job.
REFILL_EVERY_S = 5.0
# The grow's bound: the in-process loop looks for faults only between its calls. A helper job that does not start
# at once is held by the scheduler (a pending job of higher priority wants the node): it is cancelled, and the next
# look tries again.
REFILL_GROW_S = 5.0


def missing_spares(wanted: int, allocation: Sequence[str], plan: Sequence[str], kept_out: Collection[str]) -> int:
    """How many spares the job lacks: the allocation's nodes outside the step and not kept out are its spares."""
    return max(0, wanted - len([n for n in allocation if n not in plan and n not in kept_out]))


def to_take_back(missing: int, released: Sequence[Node], allocation: Collection[str]) -> list[str]:
    """Of the released nodes read, those fit to be spares again (idle, no flag, no reason asking for action), in
    the order read, at most `missing`."""
    fit = [n.name for n in released if n.is_idle and not node_is_bad(n) and n.name not in allocation]
    return fit[:missing]


class SpareRefill:
    def __init__(self, capacity: Capacity, reporter: Reporter, wanted: int, enabled: bool) -> None:
        self.capacity = capacity
        self.reporter = reporter
        self.wanted = wanted
        self.enabled = enabled and wanted > 0
        self._next_at = 0.0

    def poll(self, now: float, plan: Sequence[str], not_back: Collection[str]) -> list[str]:
        """The nodes taken back into the job as spares at this look (mostly none); `not_back`: nodes never to take
        back now (those that left the job unanswering)."""
        if not self.enabled or now < self._next_at:
            return []
        self._next_at = now + REFILL_EVERY_S
        cap, state = self.capacity, self.capacity.state
        candidates = [n for n in state.blamed_nodes if n not in not_back]
        if not candidates or cap.can_resize_again() is not None or not cap.grow or not cap.expansion_permitted():
            return []
        try:
            job = cap.client.job(cap.job_id)
            missing = missing_spares(self.wanted, job.nodes, plan, state.kept_out)
            released = [n for n in candidates if n not in job.nodes]
            if not missing or not released:
                return []
            chosen = to_take_back(missing, cap.client.known_nodes(released), job.nodes)
        except HPResilienceError as err:
            self.reporter.decision("spare_refill_unread", error=str(err)[:200])
            return []
        if not chosen or cap.take_in(chosen, REFILL_GROW_S, why="spare_refill") is None:
            return []
        self.reporter.decision("spares_refilled", nodes=compress(chosen), spares_wanted=self.wanted)
        return chosen
