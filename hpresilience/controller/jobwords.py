"""Telling running jobs about their bad nodes, so that no job has to read node state itself.

Once a second (notify_jobs_every_s) the controller's job thread reads the nodes out of service (the same
two queries as its cycle, sized by the nodes in trouble) and, when the set of bad nodes changed, the running
jobs on them (`squeue -w`, once per change). Each such job gets the bad nodes under it, with the time each
was marked, in its AdminComment (slurm/adminword.py); a job whose bad nodes are all back in service gets the
word taken off, and each job told of a bad node a nudge (slurm/adminword.nudge) so that its wrapper reads the
admin word now. What this costs slurmctld is fixed (two node queries a second) plus one job read, one job write and
one signal per job per change; it does not grow with the jobs that are merely running.

Every watch_jobs_every_s the thread also learns the running batch jobs from slurmdbd (`sacct`, nothing asked
of slurmctld) and gives each a lease in its AdminComment (`hpr:watch=<until>`, LEASE_S ahead, renewed
RENEW_EVERY_S): the promise that an admin word will come with a nudge. A wrapper holding a lease reads its own job
only when nudged and every few minutes; one without (no controller, salloc, a controller gone for
LEASE_S) keeps reading it every poll. One read and one write per job per RENEW_EVERY_S.
"""

from __future__ import annotations

import time

from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.adminword import (
    jobs_on,
    leaves_step,
    nudge,
    planned_move,
    running_batch_jobs,
    write_bad_nodes,
    write_watch,
)
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node

log = get_logger("hpresilience.controller")
# How long a told job stays on the requeue release's list: its wrapper requeues it within seconds of the
# admin word, or after a failed grow that waits up to its replace_timeout_s (10 minutes by default).
RECENT_S = 900.0
# The watch lease: long enough that a controller restart (or a slurmdbd hiccup) does not send every wrapper
# back to polling, short enough that a controller gone for good is noticed within a quarter of an hour.
LEASE_S = 900
RENEW_EVERY_S = 300
MAX_LEASES_PER_PASS = 100  # a controller starting on a busy cluster spreads its first writes over passes


class JobNotifier:
    def __init__(self, client: SlurmClient, dry_run: bool = False, watch_every_s: float = 30.0) -> None:
        self.client = client
        self.dry_run = dry_run
        self.watch_every_s = watch_every_s
        self.next_watch = 0.0
        self.leases: dict[int, int] = {}  # job -> the lease (epoch seconds) written into it
        self.last_bad: dict[str, int] | None = None
        self.told: dict[int, dict[str, int]] = {}  # job -> the bad nodes it was told of
        self.unwritable: set[int] = set()  # refused our write for good (DB index never set): not asked again
        # Jobs told of a bad node lately, with when: the ones whose wrapper may requeue them now. The requeue
        # release looks at these one by one instead of reading the whole pending queue.
        self.recent: dict[int, float] = {}

    def recently_told(self, within_s: float = RECENT_S) -> list[int]:
        cutoff = time.monotonic() - within_s
        self.recent = {j: t for j, t in self.recent.items() if t >= cutoff}
        return sorted(self.recent)

    def bad_nodes(self, nodes: list[Node]) -> dict[str, int]:
        """The nodes a step must leave (at once, or planned: drained), with the time their reason was set (now,
        when Slurm gives none)."""
        now = int(time.time())
        return {n.name: int(n.reason_changed_at or now) for n in nodes if leaves_step(n) or planned_move(n)}

    def notify(self, nodes: list[Node]) -> int:
        """Bring every affected job's admin word up to date from this snapshot of the nodes out of service;
        returns how many jobs were written to."""
        bad = self.bad_nodes(nodes)
        if bad == self.last_bad:
            return 0
        # Only the bad nodes under each job: the word grows with the job's trouble, not the cluster's.
        on_job = {j: {n: bad[n] for n in held} for j, held in (jobs_on(self.client, bad) if bad else {}).items()}
        # Jobs told before whose bad nodes are back in service: the word comes off (told an empty set).
        for j in self.told:
            on_job.setdefault(j, {})
        written, retry = 0, False
        for job_id, job_bad in on_job.items():
            if job_id in self.unwritable or self.told.get(job_id, {}) == job_bad:
                continue
            if self.dry_run:
                log.info("job_bad_nodes_would_be_written", job_id=job_id, nodes=",".join(sorted(job_bad)) or None)
                continue
            try:
                found = write_bad_nodes(self.client, job_id, job_bad)
            except HPResilienceError as err:
                if "DB index" in str(err):
                    self.unwritable.add(job_id)
                else:
                    retry = True  # slurmctld busy: the next pass tries again, even if nothing else changed
                log.warning("job_bad_nodes_not_written", job_id=job_id, error=str(err)[:300])
                continue
            if job_bad:
                self.recent[job_id] = time.monotonic()
                if found:  # its wrapper reads the admin word now rather than at its next safety-net read
                    nudge(self.client, job_id)
            if not found or not job_bad:
                self.told.pop(job_id, None)
            else:
                self.told[job_id] = job_bad
            written += 1
            log.info("job_bad_nodes_written", job_id=job_id, nodes=",".join(sorted(job_bad)) or None, found=found)
        self.last_bad = None if retry else bad
        return written

    def watch(self, now: float | None = None) -> int:
        """When due, give every running batch job a lease (new ones, and ones whose lease is RENEW_EVERY_S
        old); returns how many were written. A job the controller cannot read or write is tried next pass."""
        now = time.monotonic() if now is None else now
        if self.watch_every_s <= 0 or now < self.next_watch:
            return 0
        self.next_watch = now + self.watch_every_s
        running = running_batch_jobs(self.client)
        self.leases = {j: t for j, t in self.leases.items() if j in running}
        wall = int(time.time())
        due = sorted(
            j for j in running if j not in self.unwritable and self.leases.get(j, 0) - wall < LEASE_S - RENEW_EVERY_S
        )
        written = 0
        for job_id in due[:MAX_LEASES_PER_PASS]:
            if self.dry_run:  # said once per renewal, as a real run would write it
                log.info("job_lease_would_be_written", job_id=job_id)
                self.leases[job_id] = wall + LEASE_S
                continue
            try:
                if write_watch(self.client, job_id, wall + LEASE_S):
                    self.leases[job_id] = wall + LEASE_S
                    written += 1
            except HPResilienceError as err:
                if "DB index" in str(err):
                    self.unwritable.add(job_id)
                log.warning("job_lease_not_written", job_id=job_id, error=str(err)[:300])
        if written:
            log.info("job_leases_written", jobs=written, watched=len(self.leases), running_batch=len(running))
        return written
