"""The goodput ledger's types (its categories, a restart, the ledger) and its one-screen rendering; the
computation is ledger.py's, the in-process recovery kind inprocessparts.py's (split from ledger.py at its
400-line bound)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from hpresilience.log import printable

LEDGER_VERSION = 1


class Badput(str, Enum):
    DETECTION = "detection"
    STOP = "stop"
    REPLACEMENT = "replacement"
    REQUEUE = "requeue"
    REINIT = "reinit"
    RESTORE = "restore"
    LOST_WORK = "lost_work"
    CHECKPOINT = "checkpoint"
    INPROCESS = "inprocess_recovery"  # fault seen -> first step in the new world, survivors kept (inprocessparts.py)
    OTHER = "other"


# Root reads these records from a file the job's user can write (docs/input-validation.md): a number
# outside this range, or not finite, is not one of ours (epoch seconds, durations, step counters all fit),
# and keeping every figure inside it keeps every sum and product finite.
MAX_ABS = 1e15
# The nodes a restart names (a fault involves a few nodes; a record naming thousands is kept short).
MAX_FAULT_NODES = 64
MAX_CAUSE_CHARS = 200
MAX_NOTES = 20

# Decision records that end a job's supervision for good (a requeue is not an end: the job goes on).
ENDINGS = ("job_step_succeeded", "job_step_given_up", "supervisor_stopped", "no_replacement")


@dataclass
class Restart:
    """One relaunch or requeue after a fault."""

    at: float
    attempt: int
    cause: str
    nodes: list[str]
    action: str  # relaunch | requeue | stop (the job ended there: given up, a crash loop stopped) | inprocess
    lost_s: float | None = None
    badput_s: float = 0.0
    by_category: dict[str, float] = field(default_factory=dict)  # what this fault cost, by category
    parts: dict[str, float] = field(default_factory=dict)  # an in-process recovery's parts (inprocessparts.py)

    def to_dict(self) -> dict[str, Any]:
        shown = {"parts": {k: round(v, 3) for k, v in self.parts.items()}} if self.parts else {}
        return {
            **shown,
            "at": round(self.at, 3),
            "attempt": self.attempt,
            "cause": self.cause,
            "nodes": self.nodes,
            "action": self.action,
            "lost_s": None if self.lost_s is None else round(self.lost_s, 3),
            "badput_s": round(self.badput_s, 3),
            "by_category": {k: round(v, 3) for k, v in self.by_category.items() if v > 0.0005},
        }


@dataclass
class Ledger:
    job_id: int
    start: float = 0.0
    end: float = 0.0
    productive_s: float = 0.0
    badput_s: dict[str, float] = field(default_factory=lambda: {b.value: 0.0 for b in Badput})
    restarts: list[Restart] = field(default_factory=list)
    attempts: int = 0
    ended: bool = False  # the supervision ended for good (not a requeue, not still running)
    progress_seen: bool = False  # the step reported progress (counter lines or heartbeats)
    lost_work_known: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def add(self, category: Badput, seconds: float) -> None:
        self.badput_s[category.value] += max(0.0, seconds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": LEDGER_VERSION,
            "job_id": self.job_id,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "wall_s": round(self.wall_s, 3),
            "productive_s": round(self.productive_s, 3),
            "goodput": round(self.goodput, 4),
            "badput_s": {k: round(v, 3) for k, v in self.badput_s.items()},
            "restarts": [r.to_dict() for r in self.restarts],
            "attempts": self.attempts,
            "ended": self.ended,
            "progress_seen": self.progress_seen,
            "lost_work_known": self.lost_work_known,
            "notes": self.notes,
        }


def num(record: Mapping[str, Any], key: str) -> float | None:
    """A finite number within MAX_ABS, else None (`1e999`, NaN, 10**400 and a bool are not figures)."""
    v = record.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and -MAX_ABS <= v <= MAX_ABS:  # NaN: False
        return float(v)
    return None


def whole(record: Mapping[str, Any], key: str) -> int | None:
    v = record.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and -MAX_ABS <= v <= MAX_ABS else None


def names(text: object, limit: int | None = None) -> list[str]:
    names = [n for n in str(text or "").split(",") if n]
    return names if limit is None else names[:limit]


def render(ledger: Ledger) -> str:
    """The one-screen summary (`hpresilience job`, and the wrapper's last lines in the job's output)."""
    # The ratio as the ledger file stores it (4 places): printed from the full value, 0.31349 showed 31.3 %
    # where the file's 0.3135 reads 31.4 %.
    lines = [
        f"job {ledger.job_id}: goodput {round(ledger.goodput, 4) * 100:.1f} % "
        f"({ledger.productive_s:.1f} s productive of {ledger.wall_s:.1f} s wall, {ledger.attempts} attempt(s)"
        f"{'' if ledger.ended else ', not ended'})"
    ]
    bad = sorted(((v, k) for k, v in ledger.badput_s.items() if v > 0.0005), reverse=True)
    if bad:
        lines.append("  badput: " + ", ".join(f"{k} {v:.1f} s" for v, k in bad))
    for r in ledger.restarts:
        lost = "unknown" if r.lost_s is None else f"{r.lost_s:.1f} s"
        # cause and nodes are the user's text (the records are in their directory): escaped, one line each.
        lines.append(
            f"  {_utc(r.at)} attempt {r.attempt}: {printable(r.cause)} on {printable(','.join(r.nodes)) or '-'} "
            f"-> {r.action}, lost work {lost}, cost {r.badput_s:.1f} s"
        )
    lines.extend(f"  note: {printable(n)}" for n in ledger.notes)
    return "\n".join(lines)


def _utc(t: float) -> str:
    try:
        return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        return f"t={t:.0f}"  # a time no calendar holds (a record's own figure, within MAX_ABS)
