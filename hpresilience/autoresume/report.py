"""What the wrapper tells the world: one JSON line per decision, and Prometheus metrics in a textfile.

Decisions go to stderr through structlog (the job's error file) and to `<job>.events.jsonl` beside the
state file, so an out-of-job watcher can follow a job without reading its logs. Metrics are written to a
`.prom` file after every decision, in node_exporter's textfile-collector directory; the files of jobs
that ended long ago are removed by the next wrapper, so the directory does not grow without end.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.log import get_logger
from hpresilience.metrics import write_textfile

log = get_logger("hpresilience.autoresume")
LATENCY_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, float("inf"))
TEXTFILE_PREFIX = "hpresilience_job_"


def default_metrics_path(settings: AutoResumeSettings, job_id: int) -> str:
    """`<metrics_dir>/hpresilience_job_<id>.prom`, old files there pruned; '' (no file) when the directory is
    missing or not writable by the job's user: a file where no node_exporter reads helps nobody."""
    d = Path(settings.metrics_dir)
    if not settings.metrics_dir or not d.is_dir() or not os.access(d, os.W_OK | os.X_OK):
        log.info(
            "metrics_file_skipped",
            directory=settings.metrics_dir,
            job_id=job_id,
            why="not a directory this user can write (autoresume.metrics_dir)",
        )
        return ""
    prune_textfiles(d, settings.metrics_retention_s, keep=job_id)
    return str(d / f"{TEXTFILE_PREFIX}{job_id}.prom")


def prune_textfiles(directory: Path, retention_s: float, keep: int, now: float | None = None) -> list[str]:
    """Remove our `.prom` files not written for `retention_s` (jobs long over); others' files are left."""
    t = time.time() if now is None else now
    removed = []
    for p in directory.glob(f"{TEXTFILE_PREFIX}*.prom"):
        if p.name == f"{TEXTFILE_PREFIX}{keep}.prom":
            continue
        try:
            if p.is_symlink() or t - p.stat().st_mtime < retention_s:
                continue
            p.unlink()
            removed.append(p.name)
        except OSError:
            continue  # another user's file (sticky directory), or gone already
    if removed:
        log.info("metrics_files_pruned", directory=str(directory), files=removed)
    return removed


class Reporter:
    def __init__(self, store: WrapperStateStore, job_id: int, metrics_path: str | None) -> None:
        self.store = store
        self.job_id = job_id
        self.metrics_path = metrics_path
        self.registry = CollectorRegistry()
        labels = ["job_id"]
        self.restarts = Counter(
            "hpr_autoresume_restarts",
            "Step relaunches after a failure, by cause",
            [*labels, "cause"],
            registry=self.registry,
        )
        self.detect = Histogram(
            "hpr_autoresume_fault_detection_latency_seconds",
            "From a node being marked bad in Slurm (or the step ending) to the wrapper acting",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.restart_latency = Histogram(
            "hpr_autoresume_restart_latency_seconds",
            "From the failed step ending to the new step running",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.attempts = Gauge(
            "hpr_autoresume_attempts", "Steps launched for this job so far", labels, registry=self.registry
        )
        self.stragglers = Gauge(
            "hpr_job_straggler",
            "1 for a node of this job found slower than the others (straggler_detected)",
            [*labels, "node"],
            registry=self.registry,
        )
        self.last_restart = Gauge(
            "hpr_autoresume_last_restart_latency_seconds", "The latest restart latency", labels, registry=self.registry
        )

    def decision(self, event: str, **fields: Any) -> None:
        """Record one decision; never lets a full disk or a bad path end the supervision."""
        fields = {k: v for k, v in fields.items() if v is not None}
        log.info(event, job_id=self.job_id, **fields)
        record = {"event": event, "job_id": self.job_id, "time": time.time(), **fields}
        try:
            self.store.append_event(record)
        except OSError as err:
            log.warning("event_file_write_failed", path=str(self.store.events_path), error=str(err))
        self.flush_metrics()

    def count_restart(self, cause: str) -> None:
        self.restarts.labels(str(self.job_id), cause).inc()

    def observe_detection(self, seconds: float) -> None:
        self.detect.labels(str(self.job_id)).observe(max(0.0, seconds))

    def observe_restart(self, seconds: float) -> None:
        self.restart_latency.labels(str(self.job_id)).observe(seconds)
        self.last_restart.labels(str(self.job_id)).set(seconds)

    def straggler(self, node: str, ratio: float) -> None:
        self.stragglers.labels(str(self.job_id), node).set(1)

    def set_attempts(self, attempts: int) -> None:
        self.attempts.labels(str(self.job_id)).set(attempts)

    def flush_metrics(self) -> None:
        if not self.metrics_path:
            return
        try:
            write_textfile(self.registry, self.metrics_path)
        except OSError as err:
            log.warning("metrics_file_write_failed", path=self.metrics_path, error=str(err))
