"""Job goodput metrics exported by a root daemon (the controller), not by a directory users can write.

Per-job series used to go to node_exporter's textfile directory, which sites had to make writable by their
users' group: any user could write any series there. This collector instead reads the ledgers of the jobs
slurmdbd lists (last `window_s`), on the controller's scrape, and labels them with the job id, user and
partition *Slurm* reports. A ledger's events file is still the user's: it is read as ledgerread.py says (a
regular file of the job's user, no link, bounded in bytes, records and time, numbers finite), so it can at
worst misstate its own job's figures, never another job's nor the collector. Slurm and the ledgers are read
on a refresh thread (bounded by sacct's timeout plus `budget_s` of ledger reads); the scrape that starts a
refresh waits for it at most `wait_s`, any other scrape not at all: each is answered from the last figures
the refresh installed, never queued behind a slow ledger. A finished job's ledger is read once (cached
while Slurm's state of the job is unchanged); what one refresh costs is one sacct query (slurmdbd, not
slurmctld) every `refresh_s` and the ledgers of the jobs not yet ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hpresilience.errors import HPResilienceError
from hpresilience.goodput.jobs import load_ledger
from hpresilience.goodput.ledger import Badput, Ledger
from hpresilience.goodput.ledgerread import READ_TIMEOUT_S
from hpresilience.log import get_logger
from hpresilience.slurm.accounting import JobRecord, finished_jobs
from hpresilience.slurm.client import SlurmClient

log = get_logger("hpresilience.goodput")


@dataclass
class _Seen:
    record: JobRecord
    ledger: Ledger
    read_at: float


class LedgerCollector(Collector):
    def __init__(
        self,
        client: SlurmClient,
        state_dir: str = "",
        window_s: int = 86400,
        refresh_s: float = 60.0,
        budget_s: float = 20.0,
        read_timeout_s: float = READ_TIMEOUT_S,
        wait_s: float = 5.0,
    ) -> None:
        self.client = client
        self.state_dir = state_dir
        self.window_s = window_s
        self.refresh_s = refresh_s
        self.budget_s = budget_s
        self.read_timeout_s = read_timeout_s
        self.wait_s = wait_s
        # Held only to read or swap the results, never while Slurm or a ledger is read: that is done by
        # one refresh thread at a time, which a scrape waits for at most `wait_s` (Prometheus' default
        # scrape timeout is 10 s), and only the scrape that started it.
        self.lock = threading.Lock()
        self.worker: threading.Thread | None = None
        self.jobs: dict[int, _Seen] = {}
        self.refreshed = 0.0
        # Badput of jobs that left the window: kept so the cluster counters never go down.
        self.retired = {b.value: 0.0 for b in Badput}
        self.retired_productive = 0.0

    def refresh(self, now: float | None = None) -> None:
        t = time.time() if now is None else now
        try:
            records = finished_jobs(self.client, self.window_s)
        except HPResilienceError as err:
            log.warning("goodput_jobs_unreadable", error=str(err)[:300])
            return
        deadline = time.monotonic() + self.budget_s
        old_jobs = self.jobs
        current: dict[int, _Seen] = {}
        late = 0
        for r in records:
            old = old_jobs.get(r.job_id)
            if old is not None and old.ledger.ended and old.record.state == r.state:
                current[r.job_id] = old  # a finished job's ledger does not change
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                late += 1  # read next time; meanwhile its last figures stand
                if old is not None:
                    current[r.job_id] = old
                continue
            ledger = load_ledger(r, self.state_dir, now=t, timeout_s=min(self.read_timeout_s, left))
            if ledger is not None and ledger.attempts:
                current[r.job_id] = _Seen(r, ledger, t)
            elif ledger is None and old is not None:
                current[r.job_id] = old  # unreadable this time (out of time, stuck): its last figures stand
        if late:
            log.warning("goodput_refresh_out_of_time", ledgers_left=late, budget_s=self.budget_s)
        with self.lock:
            for job_id, seen in self.jobs.items():
                if job_id not in current:
                    for k, v in seen.ledger.badput_s.items():
                        self.retired[k] = self.retired.get(k, 0.0) + v
                    self.retired_productive += seen.ledger.productive_s
            self.jobs, self.refreshed = current, t

    def _refresh_in_background(self) -> None:
        try:
            self.refresh()
        except Exception as err:  # noqa: BLE001 - the next scrape tries again; /metrics stays up
            log.warning("goodput_refresh_failed", error=str(err)[:300])
        finally:
            with self.lock:
                self.worker = None

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            started = None
            if self.worker is None and time.time() - self.refreshed >= self.refresh_s:
                started = self.worker = threading.Thread(
                    target=self._refresh_in_background, name="hpr-goodput-refresh", daemon=True
                )
                started.start()
        if started is not None:  # this scrape asked for the refresh: it waits a little for the new figures
            started.join(self.wait_s)
        with self.lock:
            jobs = list(self.jobs.values())
            retired, retired_productive = dict(self.retired), self.retired_productive
        labels = ["job_id", "user", "partition"]
        goodput = GaugeMetricFamily(
            "hpr_job_goodput_ratio", "Productive share of the job's wall time (ledger)", labels=labels
        )
        productive = GaugeMetricFamily(
            "hpr_job_productive_seconds", "Wall time that produced kept progress", labels=labels
        )
        badput = GaugeMetricFamily(
            "hpr_job_badput_seconds", "Wall time lost, by category (docs/goodput.md)", labels=[*labels, "category"]
        )
        cluster = CounterMetricFamily(
            "hpr_cluster_badput_seconds", "Badput of every job seen, by category", labels=["category"]
        )
        cluster_productive = CounterMetricFamily("hpr_cluster_productive_seconds", "Productive time of every job seen")
        restarts = CounterMetricFamily(
            "hpr_job_restarts", "Relaunches and requeues after a fault (ledger)", labels=labels
        )
        totals = dict(retired)
        total_productive = retired_productive
        for s in jobs:
            who = [str(s.record.job_id), s.record.user, s.record.partition]
            goodput.add_metric(who, s.ledger.goodput)
            productive.add_metric(who, s.ledger.productive_s)
            restarts.add_metric(who, len(s.ledger.restarts))
            total_productive += s.ledger.productive_s
            for k, v in s.ledger.badput_s.items():
                badput.add_metric([*who, k], v)
                totals[k] = totals.get(k, 0.0) + v
        for k, v in sorted(totals.items()):
            cluster.add_metric([k], v)
        cluster_productive.add_metric([], total_productive)
        yield from (goodput, productive, badput, restarts, cluster, cluster_productive)
