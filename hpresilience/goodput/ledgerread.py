"""Root reading a job's decision records, a file in a directory the job's user owns (docs/input-validation.md).

The controller's `/metrics`, `hpresilience job` and `hpresilience goodput` run as root (or Slurm's admin) and
read `<WorkDir>/.hpresilience/jobs/<id>.events.jsonl`: its every byte, and the very kind of file it is, are the
job's user's choice. So:

- the path is walked down from the base directory (Slurm's record of the WorkDir, or the site's configured
  state directory) with one descriptor per component, each opened O_NOFOLLOW: a link below the base is
  refused, never followed to a file root alone can read;
- the file is opened O_NONBLOCK and fstat'ed: a FIFO, device or socket opens at once and is refused (a FIFO
  used to hang every scrape); it must be a regular file of the job's user (the uid of the user Slurm names):
  a file of anyone else is not that job's record;
- at most MAX_EVENTS_BYTES, MAX_RECORDS records of at most MAX_LINE_BYTES, within a deadline; a record with a
  number that is not finite is not ours; only the keys the ledger reads are kept, their strings cut short, so
  memory follows the records kept, not the file's shape;
- all of it (open, read, the ledger's computation) runs on a worker thread the caller waits on for at most
  `timeout_s`: a read stuck below us (a FUSE mount the user made, a dead NFS server) costs the caller that
  long once, and that file is not tried again while its read is still stuck (no thread piles up).
"""

from __future__ import annotations

import json
import math
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hpresilience.goodput.ledgerfile import MAX_EVENTS_BYTES
from hpresilience.log import get_logger

log = get_logger("hpresilience.goodput")

T = TypeVar("T")

MAX_RECORDS = 100_000  # a job's decisions: tens per attempt; thousands of attempts is already a storm
MAX_LINE_BYTES = 64 * 1024
READ_TIMEOUT_S = 10.0
CHUNK = 1 << 20
# The keys compute() reads, and how long a string value of each may be (None: a number, or nothing).
KEEP: dict[str, int | None] = {
    "event": 64,
    "nodes": 8192,
    "cause": 200,
    "mode": 16,  # fault_seen's: an in-process recovery (inprocessparts.py)
    **dict.fromkeys(
        (
            "time",
            "generation",
            "step",
            "started_at",
            "torn_down_at",
            "joined_at",
            "agreed_at",
            "first_step_at",
            "attempt",
            "exit_code",
            "decided_at",
            "checkpoint_s",
            "restore_s",
            "first_progress_at",
            "last_progress_at",
            "first_step",
            "last_step",
            "step_s",
            "detection_latency_s",
            "lost_s",
        )
    ),
}
OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK
OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class Refused(OSError):
    """The path is not a regular file of the job's user reached without a link: not read."""


@dataclass
class ReadStats:
    bytes_read: int = 0
    records: int = 0
    skipped: int = 0  # lines that are not one of our records
    stopped: str = ""  # why reading stopped before the file's end: bytes, records, time
    notes: list[str] = field(default_factory=list)


def open_user_file(base: Path, parts: Sequence[str], uid: int) -> int:
    """A descriptor of base/parts[0]/.../parts[-1]: each part opened from its parent's descriptor without
    following a link; the last must be a regular file owned by `uid`. Raises OSError (Refused for the
    checks of ours)."""
    dfd = os.open(base, OPEN_DIR)  # the base is Slurm's record or the site's setting: below it is the user's
    try:
        for part in parts[:-1]:
            nfd = os.open(part, OPEN_DIR | os.O_NOFOLLOW, dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
        fd = os.open(parts[-1], OPEN_FILE, dir_fd=dfd)
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    why = (
        "not a regular file"
        if not stat.S_ISREG(st.st_mode)
        else f"owned by uid {st.st_uid}, not the job's user (uid {uid})"
        if st.st_uid != uid
        else ""
    )
    if why:
        os.close(fd)
        raise Refused(f"{base.joinpath(*parts)}: {why}")
    return fd


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"not a finite number: {text[:20]}")
    return v


def _not_a_number(text: str) -> float:
    raise ValueError(f"not a number: {text}")


def _project(rec: dict[str, Any]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for key, limit in KEEP.items():
        v = rec.get(key)
        if v is None:
            continue
        if limit is not None:
            out[key] = str(v)[:limit] if isinstance(v, (str, int)) and not isinstance(v, bool) else ""
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    return out if "time" in out else None


def iter_records(fd: int, deadline: float, stats: ReadStats) -> Iterator[dict[str, Any]]:
    """The records of an open events file, read in chunks (never the whole file at once), within the bounds."""
    tail = b""
    overlong = False  # inside a line already past MAX_LINE_BYTES: skip to its end

    def parse(line: bytes) -> dict[str, Any] | None:
        try:
            rec = json.loads(line, parse_float=_finite, parse_constant=_not_a_number)
        except (ValueError, RecursionError):
            return None
        return _project(rec) if isinstance(rec, dict) else None

    while True:
        if stats.bytes_read >= MAX_EVENTS_BYTES:
            stats.stopped = "bytes"
            break
        if time.monotonic() > deadline:
            stats.stopped = "time"
            break
        chunk = os.read(fd, min(CHUNK, MAX_EVENTS_BYTES - stats.bytes_read))
        if not chunk:
            break
        stats.bytes_read += len(chunk)
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        for line in lines:
            if overlong:
                overlong = False
                continue
            rec = parse(line) if len(line) <= MAX_LINE_BYTES else None
            if rec is None:
                stats.skipped += 1
                continue
            stats.records += 1
            yield rec
            if stats.records >= MAX_RECORDS:
                stats.stopped = "records"
                return
        if len(tail) > MAX_LINE_BYTES:
            tail, overlong = b"", True
            stats.skipped += 1
    if tail and not overlong and not stats.stopped and (rec := parse(tail)) is not None:
        stats.records += 1
        yield rec


def with_deadline(key: object, timeout_s: float, work: Callable[[], T]) -> T | None:
    """`work()` on a worker thread, waited on for at most `timeout_s`; None when it did not return by then
    (it is left to finish on its own, and `key` is not tried again until it has) or when it raised."""
    with _stuck_lock:
        if key in _stuck:
            log.warning("ledger_read_still_stuck", file=str(key))
            return None
        _stuck.add(key)
    box: list[T] = []

    def run() -> None:
        try:
            box.append(work())
        except Exception as err:  # noqa: BLE001 - a ledger never takes the caller down: shown without one
            log.warning("ledger_unreadable", file=str(key), error=str(err)[:300])
        finally:
            with _stuck_lock:
                _stuck.discard(key)

    t = threading.Thread(target=run, name="hpr-ledger-read", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        log.warning("ledger_read_timed_out", file=str(key), timeout_s=timeout_s)
        return None
    return box[0] if box else None


_stuck: set[object] = set()
_stuck_lock = threading.Lock()


def read_user_records(
    base: Path,
    parts: Sequence[str],
    uid: int,
    consume: Callable[[Iterator[dict[str, Any]], ReadStats], T],
    timeout_s: float = READ_TIMEOUT_S,
) -> T | None:
    """Open base/parts as `open_user_file` does and hand its records to `consume` (on the worker thread, so
    that the records are never all in memory at once); None when it is refused, missing, or out of time."""
    path = base.joinpath(*parts)

    def work() -> T | None:
        deadline = time.monotonic() + timeout_s / 2  # the other half is for `consume` (linear in the records)
        try:
            fd = open_user_file(base, parts, uid)
        except Refused as err:
            log.warning("ledger_refused", file=str(path), why=str(err)[:300])
            return None
        except OSError:
            return None  # not there (not an auto-resume job), or a link on the way (ELOOP): not its ledger
        try:
            stats = ReadStats()
            return consume(iter_records(fd, deadline, stats), stats)
        finally:
            os.close(fd)

    return with_deadline(path, timeout_s, work)
