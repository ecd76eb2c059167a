"""Which of the step's nodes were marked bad, at a cost that does not grow with the cluster.

Reading node state costs slurmctld its whole node table (~10 ms at 10,000 nodes, whatever the filter); reading
the job costs the job (~0.4 ms). The controller writes the bad nodes under each job into the job's own record
(AdminComment, slurm/adminword.py), so the wrapper reads only its job, and only when it has to:

- Watched: the job holds the controller's lease (`hpr:watch=<until>`) and a nudge (SIGWINCH through
  `scancel --full --batch`, slurm/adminword.nudge) has been seen to reach this process: the wrapper sends itself
  one the first time it sees a lease, which proves the path on this cluster's proctrack and version. Then
  the job is read when a nudge comes (the controller nudges every job it tells of a bad node) and every
  WATCHED_READ_S as a safety net (a lost nudge, a lease run out). No node read: the controller watches them.
- Not watched (no controller, a job without a batch step such as salloc's, a nudge that never arrived, a lease
  run out): the job is read every poll as before, and the step's nodes every full_node_check_s (the only way a
  fault is seen without a controller; at 1/full_node_check_s of the node table's cost per second).

Only when the admin word names a node of the step with a mark this wrapper has not acted on yet are the step's nodes
read by name, to confirm the fault and report the node's state and reason.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import Enum

from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger
from hpresilience.reasons import parse_reason
from hpresilience.slurm.adminword import leaves_step, nudge, planned_move, read_admin_word
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node

log = get_logger("hpresilience.autoresume")
# The safety-net read while watched: a lost nudge costs at most this much detection time, and the read costs
# slurmctld ~0.4 ms / 60 s per job.
WATCHED_READ_S = 60.0
# How long the nudge the wrapper sends itself may take to come back before the path is taken for broken.
NUDGE_PROOF_S = 10.0

HARD_STATES = frozenset({"FAIL", "DOWN", "NOT_RESPONDING"})


def node_is_bad(node: Node) -> bool:
    """The node must leave the step: Slurm or the agent says it is broken, or its reason asks for action."""
    if node.states & HARD_STATES:
        return True
    return parse_reason(node.reason).action is not None and node.has("DRAIN", "FAIL", "DOWN")


def unfit_to_wait(node: Node) -> bool:
    """A node of the allocation outside the step that cannot serve as a spare: bad (node_is_bad), or drained."""
    return node_is_bad(node) or node.has("DRAIN")


class Nudges(Enum):
    """Whether the controller's nudges reach this process."""

    UNTRIED = "untried"  # no lease seen yet
    SENT = "sent"  # the wrapper nudged itself and waits for it
    PROVEN = "proven"  # it came back: a lease can be trusted
    LOST = "lost"  # it did not come back, or could not be sent: poll, for the rest of the job


class NodeWatch:
    def __init__(
        self, client: SlurmClient, job_id: int, full_check_s: float = 120.0, watched_read_s: float = WATCHED_READ_S
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.full_check_s = full_check_s
        self.watched_read_s = watched_read_s
        self.acted: dict[str, int] = {}  # node -> the mark time already looked at (a later mark is news)
        self.next_full = time.monotonic() + full_check_s if full_check_s > 0 else float("inf")
        self.lease_until = 0  # the controller's lease last read from the job (epoch seconds)
        self.proof = Nudges.UNTRIED
        self.proof_sent_at = 0.0
        self.next_read = 0.0  # while watched: the safety-net read
        self.nudges = 0  # counted by the signal handler (a plain increment: safe there)
        self._nudges_seen = 0
        self.reads = 0  # own-job reads so far (what the tests and the bench count)

    def on_nudge(self) -> None:
        """From the SIGWINCH handler: the job's record changed; read it at the next poll."""
        self.nudges += 1

    def nudged(self) -> bool:
        """Whether a nudge came since the last poll (the step loop polls at once then)."""
        return self.nudges != self._nudges_seen

    def watched(self) -> bool:
        return self.proof is Nudges.PROVEN and self.lease_until > time.time()

    def bad_nodes(self, step_nodes: Sequence[str]) -> list[Node]:
        """The step's nodes that must leave it, confirmed against their own state; [] when slurmctld does
        not answer (an unanswering slurmctld is neither a healthy verdict nor a reason to kill a step)."""
        now = time.monotonic()
        nudged = self.nudged()
        self._nudges_seen = self.nudges
        if nudged and self.proof is Nudges.SENT:
            self.proof = Nudges.PROVEN
            log.info(
                "job_nudges_received",
                job_id=self.job_id,
                took_s=round(now - self.proof_sent_at, 3),
                safety_read_every_s=self.watched_read_s,
            )
        watched = self.watched()
        if watched and not nudged and now < self.next_read:
            return []
        try:
            word = read_admin_word(self.client, self.job_id)
        except HPResilienceError as err:
            log.warning("slurm_poll_failed", error=str(err)[:300])
            return []
        self.reads += 1
        self.next_read = now + self.watched_read_s
        self.lease_until = word.watched_until
        if self.lease_until > time.time() and self.proof is Nudges.UNTRIED:
            self._prove_nudge(now)
        elif self.proof is Nudges.SENT and now - self.proof_sent_at > NUDGE_PROOF_S:
            self.proof = Nudges.LOST  # once: this job keeps polling
            log.warning("job_nudge_not_received", job_id=self.job_id, waited_s=NUDGE_PROOF_S, poll_every_s="each poll")
        if watched and self.lease_until <= time.time():
            log.warning("job_lease_ran_out", job_id=self.job_id, lease_until=self.lease_until)
        news = {n: t for n, t in word.bad.items() if n in step_nodes and self.acted.get(n) != t}
        full_due = not self.watched() and now >= self.next_full
        if not news and not full_due:
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

    def _prove_nudge(self, now: float) -> None:
        """A lease is there: send this job the nudge the controller would, and trust the lease once it comes
        back (proctrack, a wrapper started outside the batch step or in a new session can keep it from us)."""
        self.proof, self.proof_sent_at = Nudges.SENT, now
        try:
            sent = nudge(self.client, self.job_id)
        except HPResilienceError as err:
            sent = False
            log.warning("job_nudge_not_sent", job_id=self.job_id, error=str(err)[:300])
        if not sent:
            self.proof = Nudges.LOST
            log.warning("job_nudge_refused", job_id=self.job_id, poll_every_s="each poll")
