"""The wrapper's side of the goodput ledger: the per-attempt progress record, and `<job>.ledger.json`.

The supervisor calls `attempt_record` once an attempt's step has ended (what the one progress stream saw,
in wall-clock time) and `write_ledger` whenever its supervision ends; the ledger itself is computed from
the job's decision records (ledger.py), so a requeued job's next batch run simply recomputes it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import IO, Any, Protocol

from hpresilience.fileio import atomic_write_text
from hpresilience.goodput.ledger import Ledger, compute, render
from hpresilience.log import get_logger

log = get_logger("hpresilience.goodput")


class Progress(Protocol):
    """What the record reads of a step's progress (the wrapper's `autoresume.progress.ProgressStream`, which this
    package, below the wrapper, does not import): monotonic times, step counters, time blocked on checkpoints."""

    def steps_seen(self) -> tuple[int, int] | None: ...

    def first_progress(self) -> float | None: ...

    def last_progress(self) -> float | None: ...

    def median_interval(self) -> float | None: ...

    def blocked(self) -> tuple[float, float] | None: ...


# An events file is the wrapper's own, but it lives in the user's directory: read at most this much.
MAX_EVENTS_BYTES = 64 * 1024 * 1024


def _wall(mono: float | None, now_mono: float, now_wall: float) -> float | None:
    return None if mono is None else round(now_wall - (now_mono - mono), 3)


def attempt_record(progress: Progress, attempt: int, decided_at: float, exit_code: int) -> dict[str, Any]:
    """The fields of the `attempt_ended` decision: steps and times from the progress stream, wall clock."""
    now_mono, now_wall = time.monotonic(), time.time()
    seen = progress.steps_seen()
    first_at, last_at = progress.first_progress(), progress.last_progress()
    step_s = None
    if seen is not None and seen[1] > seen[0] and first_at is not None and last_at is not None:
        step_s = round((last_at - first_at) / (seen[1] - seen[0]), 4)
    elif progress.median_interval() is not None:
        step_s = round(progress.median_interval() or 0.0, 4) or None
    blocked = progress.blocked()
    return {
        "attempt": attempt,
        "exit_code": exit_code,
        "decided_at": _wall(decided_at, now_mono, now_wall),
        "checkpoint_s": round(blocked[0], 3) if blocked else None,
        "restore_s": round(blocked[1], 3) if blocked else None,
        "first_progress_at": _wall(first_at, now_mono, now_wall),
        "last_progress_at": _wall(last_at, now_mono, now_wall),
        "first_step": seen[0] if seen else None,
        "last_step": seen[1] if seen else None,
        "step_s": step_s,
    }


def read_events(path: Path) -> list[dict[str, Any]]:
    """The decision records of a job; a line that is not a JSON object is skipped (never fatal)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_EVENTS_BYTES)
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def ledger_path(events_path: Path) -> Path:
    return events_path.with_name(events_path.name.replace(".events.jsonl", ".ledger.json"))


def write_ledger(job_id: int, events_path: Path, now: float | None = None) -> Ledger:
    """Recompute the ledger from the events file and write it beside it (atomically)."""
    ledger = compute(job_id, read_events(events_path), now=now)
    atomic_write_text(ledger_path(events_path), json.dumps(ledger.to_dict(), indent=1, sort_keys=True), fsync=True)
    return ledger


def close_ledger(job_id: int, events_path: Path, out: IO[bytes]) -> None:
    """Write `<job>.ledger.json` beside the events; when the job ends here (not a requeue), print its summary
    into the job's output (`out`). A ledger that cannot be written never changes the job's outcome."""
    try:
        ledger = write_ledger(job_id, events_path)
    except (OSError, ValueError) as err:
        log.warning("ledger_write_failed", path=str(events_path), error=str(err)[:300])
        return
    if ledger.ended:
        try:
            out.write(("[hpresilience] " + render(ledger).replace("\n", "\n[hpresilience] ") + "\n").encode())
            out.flush()
        except (OSError, ValueError):
            pass  # the job's output is gone; the ledger file holds the same
