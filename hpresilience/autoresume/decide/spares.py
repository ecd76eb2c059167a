"""Keeping the hot spares the job asked for (in-process mode), between faults: a spare that goes out of service
leaves the job, and a spare spent on a replacement, or one that left, is made good by a node this job released,
once that node is back in service and idle.

With `--auto-resume-spares=1` the first fault is replaced by the spare's warm standby in under a second; without a
refill every later fault finds no spare and waits for a grow and a cold start (a Python start, `import torch`, the
model built: 20-40 s on a loaded machine, the bulk of a cold recovery). On a cluster that repairs nodes (the
controller, or HyperPod's replacement under the same name) the failed node comes back idle minutes later: taking it
back into the job as the new spare, with a standby started on it, makes the next fault as cheap as the first.

A spare the agent or an operator marks (a GPU fault while it waits) is no spare: the job would count it and find
it unusable at the next fault, and the controller repairs a node only once no job holds it (or after
forced_down_after_s). So it leaves the job at the next look (its standby stopped first) and comes back as any
released node.

Each look (every autoresume.spare_check_s, 30 s) is one read of the job and one of its spares and released nodes by
name (sized by the job, never the cluster's node table). Other idle nodes of the partition are not sought between
faults; a fault still grows into any of them (capacity.py). A node that left the job unanswering is not taken back
as a spare: slurmctld ends the job on it once it answers again, killing any step of the job there, so it comes back
only as a replacement at a fault, which the loop's rejoin handling covers (inprocess.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from hpresilience.autoresume.decide.capacity import Capacity
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.nodewatch import unfit_to_wait
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.hostlist import compress
from hpresilience.slurm.models import Job, Node

# The grow's bound: the in-process loop looks for faults only between its calls. A helper job that does not start
# at once is held by the scheduler (a pending job of higher priority wants the node): it is cancelled, and the next
# look tries again.
REFILL_GROW_S = 5.0


def to_take_back(missing: int, released: Sequence[Node], allocation: Collection[str]) -> list[str]:
    """Of the released nodes read, those fit to be spares again (idle with no flag: no DRAIN, FAIL or DOWN, so no
    mark asking for action either), in the order read, at most `missing`."""
    fit = [n.name for n in released if n.is_idle and n.name not in allocation]
    return fit[: max(0, missing)]


class SpareRefill:
    def __init__(
        self,
        capacity: Capacity,
        reporter: Reporter,
        wanted: int,
        enabled: bool,
        every_s: float,
        before_leaving: Callable[[list[str]], object] = lambda nodes: None,
    ) -> None:
        self.capacity = capacity
        self.reporter = reporter
        self.wanted = wanted
        self.every_s = every_s
        self.enabled = enabled and wanted > 0
        self.before_leaving = before_leaving  # stops what runs on spares about to leave the job (their standbys)
        self._next_at = 0.0

    def poll(self, now: float, plan: Sequence[str], not_back: Collection[str]) -> list[str]:
        """The nodes taken back into the job as spares at this look (mostly none); `not_back`: nodes never to take
        back now (those that left the job unanswering)."""
        if not self.enabled or now < self._next_at:
            return []
        self._next_at = now + self.every_s
        cap, state = self.capacity, self.capacity.state
        try:
            job = cap.client.job(cap.job_id)
            spares = [n for n in job.nodes if n not in plan and n not in state.kept_out]
            released = [n for n in state.blamed_nodes if n not in job.nodes and n not in not_back]
            read = {n.name: n for n in cap.client.known_nodes([*spares, *released])}
            leaving = [n for n in spares if n in read and unfit_to_wait(read[n])]
            if leaving:
                job = self._leave(job, leaving, read)
        except HPResilienceError as err:
            self.reporter.decision("spare_refill_unread", error=str(err)[:200])
            return []
        missing = self.wanted - (len(spares) - len(leaving))
        if missing <= 0 or not released or cap.can_resize_again() is not None:
            return []
        if not cap.grow or not cap.expansion_permitted():
            return []
        chosen = to_take_back(missing, [read[n] for n in released if n in read], job.nodes)
        if not chosen or cap.take_in(chosen, REFILL_GROW_S, why="spare_refill") is None:
            return []
        self.reporter.decision("spares_refilled", nodes=compress(chosen), spares_wanted=self.wanted)
        return chosen

    def _leave(self, job: Job, leaving: list[str], read: dict[str, Node]) -> Job:
        """Spares out of service leave the job: blamed and kept out (no plan takes them; a release Slurm refuses
        keeps them out of the count), their standbys stopped, then released."""
        state = self.capacity.state
        states = ",".join(f"{n}:{read[n].state_text}" for n in leaving)
        self.reporter.decision("spares_out_of_service", nodes=compress(leaving), states=states)
        state.blame(leaving)
        state.kept_out.extend(n for n in leaving if n not in state.kept_out)
        self.before_leaving(leaving)
        self.capacity.unhealthy(job)  # what Slurm already calls lost is Slurm's to excise (Capacity.release)
        return self.capacity.release(job, set(leaving))
