"""The controller's job thread: notices to the jobs on bad nodes, and releases of the jobs their wrappers requeued.

It runs beside the repair cycle (loop.py), on its own schedule (notify_jobs_every_s, release_requeued_every_s),
so that a slow repair cycle never delays a job's notice. `Controller` (loop.py) is a `JobThread`: the thread
shares the controller's client, settings and stop event, and nothing of its repairs.
"""

from __future__ import annotations

import threading
import time

from hpresilience.controller.jobwords import JobNotifier
from hpresilience.controller.settings import ControllerSettings
from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.features import SlurmFeatures
from hpresilience.slurm.jobs import held_among, release_requeued_job, requeued_jobs_held

log = get_logger("hpresilience.controller")


class JobThread:
    def __init__(self, settings: ControllerSettings, client: SlurmClient) -> None:
        self.settings = settings
        self.client = client
        self.stop_event = threading.Event()
        self.notifier = JobNotifier(client, dry_run=settings.dry_run, watch_every_s=settings.watch_jobs_every_s)
        self._last_scan = time.monotonic()  # the first whole-queue scan comes one release_scan_every_s in
        self._next_notice = self._next_release = 0.0
        # Slurm itself starts requeued jobs as soon as we would (requeue_delay, 25.11+): no releases of ours.
        self.release_left_to_slurm = False
        self.features: SlurmFeatures | None = None  # probe_slurm_features, once at start

    def probe_slurm_features(self) -> SlurmFeatures | None:
        """Slurm's own resilience features on this cluster (slurm/features.py), read once at start and kept; None
        when unreadable (every feature then counts as absent: the project's own paths work on every release)."""
        try:
            self.features = self.client.features()
        except HPResilienceError as err:
            log.warning("slurm_features_probe_failed", error=str(err)[:300])
            return None
        log.info("slurm_features_probed", version=self.features.version, features=self.features.names())
        return self.features

    def release_requeued(self, scan: bool = False) -> int:
        """Start every job the wrapper requeued (its comment carries the marker) now: the wrapper asked for
        a requeue because the job cannot go on in place, and Slurm's hold would only add two minutes.
        Looks at the jobs told of a bad node lately, one by one; `scan`: the whole pending queue too."""
        released = 0
        told = self.notifier.recently_told()
        held = held_among(self.client, told)  # each read exactly, by itself (slurm/jobs.py held_job)
        if scan:
            held += requeued_jobs_held(self.client, known=set(told))
        for job in held:
            try:
                release_requeued_job(self.client, job)
            except HPResilienceError as err:
                log.warning("requeued_job_not_released", job_id=job.job_id, error=str(err)[:300])
                continue
            released += 1
            log.info("requeued_job_released", job_id=job.job_id, reason=job.reason)
        return released

    def slurm_releases_requeued_jobs(self) -> int | None:
        """Slurm's own hold on a requeued job when it is no longer than our release interval (the site set
        requeue_delay on 25.11+): then Slurm starts the job as soon as we would, the release thread is not started,
        and the wrapper takes its marker off when the job runs again. None: our release thread is needed."""
        if self.features is not None:
            delay = self.features.requeue_delay_s
        else:
            try:
                delay = self.client.requeue_delay_s()
            except HPResilienceError as err:  # an unreadable probe keeps the thread: never wrong, only needless
                log.warning("requeue_delay_probe_failed", error=str(err)[:300])
                return None
        if delay is None or delay > self.settings.release_requeued_every_s:
            return None
        log.info(
            "requeue_release_left_to_slurm",
            requeue_delay_s=delay,
            release_requeued_every_s=self.settings.release_requeued_every_s,
        )
        return delay

    def notify_jobs(self, now: float | None = None) -> int:
        """Tell the running jobs on bad nodes (AdminComment), from one read of the nodes out of service."""
        told = self.notifier.notify(self.client.nodes_out_of_service())
        try:
            self.notifier.watch(now)  # leases to the running batch jobs, every watch_jobs_every_s
        except HPResilienceError as err:  # slurmdbd down: no new leases; the wrappers keep polling
            log.warning("job_leases_failed", error=str(err)[:300], kind=type(err).__name__)
        return told

    def jobs_tick(self, now: float) -> tuple[float, float]:
        """One pass of the job thread at monotonic `now`; returns when the next notice and release are due."""
        s = self.settings
        if s.notify_jobs_every_s > 0 and now >= self._next_notice:
            self._next_notice = now + s.notify_jobs_every_s
            try:
                self.notify_jobs(now)
            except HPResilienceError as err:
                log.warning("job_notices_failed", error=str(err)[:300], kind=type(err).__name__)
        if s.release_requeued_every_s > 0 and not self.release_left_to_slurm and now >= self._next_release:
            self._next_release = now + s.release_requeued_every_s
            scan = s.release_scan_every_s > 0 and now - self._last_scan >= s.release_scan_every_s
            if scan:
                self._last_scan = now
            try:
                self.release_requeued(scan=scan)
            except HPResilienceError as err:  # a failed look (slurmctld busy) is retried next time
                log.warning("requeued_jobs_unreadable", error=str(err)[:300], kind=type(err).__name__)
        return self._next_notice, self._next_release

    def start_jobs_thread(self) -> threading.Thread:
        """The job thread on its own (run() starts it; a bench or a test may start it without the cycle)."""
        thread = threading.Thread(target=self._jobs_loop, name="jobs", daemon=True)
        thread.start()
        return thread

    def _jobs_loop(self) -> None:
        """The job thread: notices to jobs on bad nodes, and releases of the jobs their wrappers requeued."""
        self._next_notice = self._next_release = time.monotonic()
        while not self.stop_event.is_set():
            due = [
                t
                for t, every in (
                    (self._next_notice, self.settings.notify_jobs_every_s),
                    (self._next_release, 0 if self.release_left_to_slurm else self.settings.release_requeued_every_s),
                )
                if every > 0
            ]
            if not due:
                return
            if self.stop_event.wait(max(0.0, min(due) - time.monotonic())):
                return
            self.jobs_tick(time.monotonic())
