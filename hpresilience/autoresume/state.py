"""The wrapper's memory across a requeue: one JSON file per job id, replaced atomically.

A requeued batch script starts again from the top with the same SLURM_JOB_ID; the wrapper it starts
reads this file and carries on counting attempts, remembers which nodes it blamed and whether the
allocation was already resized (Slurm allows that once per job with accounting_storage/none) or Slurm
refuses to resize it for good (slurmdbd was unreachable at a resize), and
hands the restart policy back its windows.
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
STATE_VERSION = 1


@dataclass
class WrapperState:
    job_id: int
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
    finished: bool = False
    exit_code: int | None = None

    def blame(self, nodes: list[str] | tuple[str, ...]) -> None:
        for n in nodes:
            if n not in self.blamed_nodes:
                self.blamed_nodes.append(n)

    def count_restart(self, cause: str) -> None:
        self.restarts += 1
        self.restarts_by_cause[cause] = self.restarts_by_cause.get(cause, 0) + 1


def default_state_dir(env: dict[str, str] | os._Environ[str]) -> Path:
    submit = env.get("SLURM_SUBMIT_DIR")
    if submit:
        return Path(submit) / ".hpresilience" / "jobs"
    return Path(env.get("HOME", "/tmp")) / ".hpresilience" / "jobs"


class StateStore:
    def __init__(self, directory: Path, job_id: int) -> None:
        self.directory = directory
        self.job_id = job_id

    @property
    def path(self) -> Path:
        return self.directory / f"{self.job_id}.json"

    @property
    def events_path(self) -> Path:
        return self.directory / f"{self.job_id}.events.jsonl"

    def load(self) -> WrapperState:
        """The saved state, or a fresh one; an unreadable file is logged and set aside, never fatal."""
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION or data.get("job_id") != self.job_id:
                raise ValueError("not a state file of this job and version")
            data.pop("version")
            return WrapperState(**data)
        except FileNotFoundError:
            return WrapperState(self.job_id)
        except (OSError, ValueError, TypeError) as err:
            aside = self.path.with_suffix(".json.bad")
            try:
                os.replace(self.path, aside)
            except OSError:
                aside = self.path
            log.warning("state_file_unreadable", path=str(self.path), error=str(err)[:200], moved_to=str(aside))
            return WrapperState(self.job_id)

    def save(self, state: WrapperState) -> None:
        # On a shared file system, and read back by the next batch run after a requeue: fsync before rename.
        data = {"version": STATE_VERSION, **asdict(state)}
        atomic_write_text(self.path, json.dumps(data, indent=1, sort_keys=True), fsync=True)

    def append_event(self, record: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.events_path, "a") as f:
            f.write(json.dumps(record, sort_keys=True, default=str) + "\n")
