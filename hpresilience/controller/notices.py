"""Telling running jobs about their bad nodes, so that no job has to read node state itself.

Once a second (notify_jobs_every_s) the controller's job thread reads the nodes out of service (the same
two queries as its cycle, sized by the nodes in trouble) and, when the set of bad nodes changed, the running
jobs on them (`squeue -w`, once per change). Each such job gets the bad nodes under it, with the time each
was marked, in its AdminComment (slurm/notice.py); a job whose bad nodes are all back in service gets the
word taken off. What this costs slurmctld is fixed (two node queries a second) plus one job read and one
job write per job per change; it does not grow with the jobs that are merely running.
"""

from __future__ import annotations

import time

from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.slurm.notice import jobs_on, leaves_step, planned_move, write_notice

log = get_logger("hpresilience.controller")
# How long a told job stays on the requeue release's list: its wrapper requeues it within seconds of the
# notice, or after a failed grow that waits up to its replace_timeout_s (10 minutes by default).
RECENT_S = 900.0


class JobNotifier:
    def __init__(self, client: SlurmClient, dry_run: bool = False) -> None:
        self.client = client
        self.dry_run = dry_run
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
        """Bring every affected job's notice up to date from this snapshot of the nodes out of service;
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
                log.info("job_notice_would_be_written", job_id=job_id, nodes=",".join(sorted(job_bad)) or None)
                continue
            try:
                found = write_notice(self.client, job_id, job_bad)
            except HPResilienceError as err:
                if "DB index" in str(err):
                    self.unwritable.add(job_id)
                else:
                    retry = True  # slurmctld busy: the next pass tries again, even if nothing else changed
                log.warning("job_notice_not_written", job_id=job_id, error=str(err)[:300])
                continue
            if job_bad:
                self.recent[job_id] = time.monotonic()
            if not found or not job_bad:
                self.told.pop(job_id, None)
            else:
                self.told[job_id] = job_bad
            written += 1
            log.info("job_notice_written", job_id=job_id, nodes=",".join(sorted(job_bad)) or None, found=found)
        self.last_bad = None if retry else bad
        return written
