"""The wrapper's memory across a requeue: one JSON file per job, replaced atomically.

A requeued batch script starts again from the top with the same SLURM_JOB_ID; the wrapper it starts
reads this file and carries on counting attempts, remembers which nodes it blamed and whether the
allocation was resized or Slurm refuses to resize it for good (slurmdbd was unreachable at a resize),
and hands the restart policy back its windows.

A job id alone does not name a job: a reinstalled cluster starts again at job 1, and two clusters may
share a home directory. So the file records which job it belongs to (cluster name, job id, and the
job's submit time with its restart count) and a file of another job is set aside, never used
(`belongs_to`). Slurm gives a requeued job a new submit time, so a later run of the same job is
recognised by a higher restart count and a submit time no older than the recorded one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpresilience.fileio import atomic_write_text
from hpresilience.log import get_logger

log = get_logger("hpresilience.autoresume")
# 2: the file names its job (cluster, submit time); a version-1 file cannot be told apart from another job's.
STATE_VERSION = 2


@dataclass(frozen=True)
class JobIdentity:
    """Which job a wrapper runs in; submit_time is Slurm's `SubmitTime` (ISO text, "" when unknown)."""

    cluster: str
    job_id: int
    submit_time: str
    restart_count: int


@dataclass
class WrapperState:
    job_id: int
    cluster: str = ""
    submit_time: str = ""  # SubmitTime of the batch run that last saved this file
    attempts: int = 0  # steps launched so far, over every run of the batch script
    restarts: int = 0  # relaunches after a failure
    restarts_by_cause: dict[str, int] = field(default_factory=dict)
    blamed_nodes: list[str] = field(default_factory=list)
    resized: bool = False  # the allocation was resized at least once
    # Slurm refused a resize for good ("DB index is being set"): later faults keep bad nodes inside the job.
    resize_refused: bool = False
    kept_out: list[str] = field(default_factory=list)  # blamed nodes still in the allocation, out of the step
    slurm_restart_count: int = 0  # SLURM_RESTART_COUNT of the allocation the fields above describe
    requeues: int = 0
    last_nodes: list[str] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=dict)  # the restart policy's own serialized windows
    crashes: list[dict[str, Any]] = field(default_factory=list)  # failed attempts' records (decide/crashloop.py)
    integrity: dict[str, Any] = field(default_factory=dict)  # the integrity watch's memory (watch/integrity.py)
    finished: bool = False
    exit_code: int | None = None

    def blame(self, nodes: list[str] | tuple[str, ...]) -> None:
        for n in nodes:
            if n not in self.blamed_nodes:
                self.blamed_nodes.append(n)

    def count_restart(self, cause: str) -> None:
        self.restarts += 1
        self.restarts_by_cause[cause] = self.restarts_by_cause.get(cause, 0) + 1


def belongs_to(state: WrapperState, who: JobIdentity) -> str | None:
    """None when `state` was written by this job (this run or an earlier run of it), else why not."""
    if state.job_id != who.job_id:
        return f"it is job {state.job_id}'s"
    if state.cluster and who.cluster and state.cluster != who.cluster:
        return f"it is job {state.job_id} of cluster {state.cluster!r}, this is cluster {who.cluster!r}"
    # Without both submit times the file cannot be told apart from another job's with the same id (a
    # reinstalled cluster, a shared home): never adopted. Losing a requeued job's counters is the lesser harm.
    if not who.submit_time:
        return "this job's submit time could not be read from Slurm, so no state file can be shown to be its own"
    if not state.submit_time:
        return "the file records no submit time, so it cannot be shown to be this job's"
    if who.restart_count == state.slurm_restart_count:
        if state.submit_time != who.submit_time:
            return f"it belongs to a job submitted at {state.submit_time}, this one was submitted at {who.submit_time}"
        return None
    if who.restart_count > state.slurm_restart_count and state.submit_time <= who.submit_time:
        return None  # a requeue: Slurm gave the job a new submit time and counted one more restart
    return (
        f"it belongs to a job submitted at {state.submit_time} (restart {state.slurm_restart_count}), "
        f"this one was submitted at {who.submit_time} (restart {who.restart_count})"
    )


def default_state_dir(env: dict[str, str] | os._Environ[str]) -> Path:
    submit = env.get("SLURM_SUBMIT_DIR")
    if submit:
        return Path(submit) / ".hpresilience" / "jobs"
    return Path(env.get("HOME", "/tmp")) / ".hpresilience" / "jobs"


class WrapperStateStore:
    """A job's `WrapperState` file and its decision records, in the wrapper's state directory (the controller's
    repair records are controller/state.py's `StateStore`, another thing)."""

    def __init__(self, directory: Path, job_id: int) -> None:
        self.directory = directory
        self.job_id = job_id
        self.set_aside: dict[str, str] | None = None  # set when load() found another job's file

    @property
    def path(self) -> Path:
        return self.directory / f"{self.job_id}.json"

    @property
    def events_path(self) -> Path:
        return self.directory / f"{self.job_id}.events.jsonl"

    def load(self, who: JobIdentity | None = None) -> WrapperState:
        """This job's saved state, or a fresh one. An unreadable file, or one that belongs to another job
        (checked against `who`), is logged and set aside, never fatal and never used."""
        fresh = WrapperState(
            self.job_id, cluster=who.cluster if who else "", submit_time=who.submit_time if who else ""
        )
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION or data.get("job_id") != self.job_id:
                raise ValueError(f"not a version-{STATE_VERSION} state file of job {self.job_id}")
            data.pop("version")
            state = WrapperState(**data)
        except FileNotFoundError:
            return fresh
        except (OSError, ValueError, TypeError) as err:
            aside = self._set_aside(".bad")
            log.warning("state_file_unreadable", path=str(self.path), error=str(err)[:200], moved_to=str(aside))
            return fresh
        why = belongs_to(state, who) if who is not None else None
        if why is not None:
            aside = self._set_aside(f".foreign-{_stamp(state.submit_time)}", with_events=True)
            self.set_aside = {"path": str(self.path), "why": why, "moved_to": str(aside)}
            log.warning("state_file_of_another_job", **self.set_aside)
            return fresh
        if who is not None:
            state.cluster = state.cluster or who.cluster
            state.submit_time = who.submit_time or state.submit_time
        return state

    def _set_aside(self, suffix: str, with_events: bool = False) -> Path:
        aside = self.path.with_name(self.path.name + suffix)
        moves = [(self.path, aside)]
        if with_events:
            # The decision log and metrics of that other job must not be continued by this one either.
            for p in (self.events_path, self.directory / f"{self.job_id}.prom"):
                moves.append((p, p.with_name(p.name + suffix)))
        for src, dst in moves:
            try:
                os.replace(src, dst)
            except FileNotFoundError:
                pass
            except OSError:
                if src == self.path:
                    aside = self.path
        return aside

    def save(self, state: WrapperState) -> None:
        # On a shared file system, and read back by the next batch run after a requeue: fsync before rename.
        data = {"version": STATE_VERSION, **asdict(state)}
        atomic_write_text(self.path, json.dumps(data, indent=1, sort_keys=True), fsync=True)

    def append_event(self, record: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.events_path, "a") as f:
            f.write(json.dumps(record, sort_keys=True, default=str) + "\n")


def _stamp(submit_time: str) -> str:
    return "".join(ch for ch in submit_time if ch.isalnum()) or "unknown"
