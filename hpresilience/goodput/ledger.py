"""A job's goodput ledger: where its wall time went, computed from the wrapper's own decision records.

The wrapper already writes every decision to `<job>.events.jsonl` (report.py), and at the end of each
attempt one `attempt_ended` record with what the progress stream saw (first and last step counter, when,
the step time). The ledger is a pure function of those records, so it survives a requeue (the next batch
run appends to the same file), can be recomputed for a running job, and never parses the step's output a
second time. docs/goodput.md defines the categories; in short, for attempt k:

    launch L -> first step starts W -> fault F -> wrapper decides D -> old tasks gone S -> relaunch R -> L'
       reinit      productive/lost      detection       stop            replacement|requeue|other

W is the first progress report less one step time (the first step is work, its start ends the reinit).
The steps of attempt k that the next attempt did not redo are productive; the rest of [W, F] is lost work
(steps redone, plus the part of a step cut off by the fault). Every boundary is clamped between its
neighbours, so the categories and the productive time sum to the wall time by construction.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
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
    action: str  # relaunch | requeue | stop (the job ended there: given up, a crash loop stopped)
    lost_s: float | None = None
    badput_s: float = 0.0
    by_category: dict[str, float] = field(default_factory=dict)  # what this fault cost, by category

    def to_dict(self) -> dict[str, Any]:
        return {
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


@dataclass(slots=True)
class _Attempt:
    number: int
    launched: float
    nodes: str  # as recorded, comma-separated: split only to compare (a long list costs no memory per name)
    ended: dict[str, Any] | None = None  # the attempt_ended record
    fault_marks: list[float] = field(default_factory=list)  # when Slurm marked a node of it bad
    fault: dict[str, Any] | None = None  # fault_seen
    stopped: float | None = None  # old tasks checked (reap) done
    relaunching: float | None = None
    requeued: float | None = None
    no_replacement: bool = False

    progress: dict[str, Any] | None = None  # attempt_progress: its first step, written as soon as seen

    def first_step(self) -> int | None:
        return _int(self.ended or self.progress or {}, "first_step")

    def step_s(self) -> float | None:
        v = _num(self.ended or {}, "step_s")
        return v if v is not None and v > 0 else None

    def blocked(self, key: str) -> float:
        """Seconds hpresilience.torch reported blocked (`checkpoint_s`, `restore_s`) in this attempt."""
        v = _num(self.ended or {}, key)
        return v if v is not None and v > 0 else 0.0


def _num(record: Mapping[str, Any], key: str) -> float | None:
    """A finite number within MAX_ABS, else None (`1e999`, NaN, 10**400 and a bool are not figures)."""
    v = record.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and -MAX_ABS <= v <= MAX_ABS:  # NaN: False
        return float(v)
    return None


def _int(record: Mapping[str, Any], key: str) -> int | None:
    v = record.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and -MAX_ABS <= v <= MAX_ABS else None


def _names(text: object, limit: int | None = None) -> list[str]:
    names = [n for n in str(text or "").split(",") if n]
    return names if limit is None else names[:limit]


def _attempts(events: Iterable[Mapping[str, Any]]) -> tuple[list[_Attempt], float | None, bool]:
    attempts: list[_Attempt] = []
    last_time: float | None = None
    ended = False
    for e in events:
        t = _num(e, "time")
        if t is None:
            continue  # not one of our records
        last_time = t if last_time is None else max(last_time, t)
        name = e.get("event")
        if name in ("supervisor_started", "job_requeue_requested"):
            ended = False
        if name == "attempt_started":
            attempts.append(_Attempt(_int(e, "attempt") or len(attempts) + 1, t, str(e.get("nodes") or "")))
            continue
        if name in ENDINGS:
            ended = True
        if not attempts:
            continue
        a = attempts[-1]
        if name == "attempt_ended":
            a.ended = dict(e)
        elif name == "attempt_progress":
            a.progress = dict(e)
        elif name == "node_fault_seen":
            age = _num(e, "detection_latency_s")
            a.fault_marks.append(t - age if age is not None else t)
        elif name == "fault_seen":
            a.fault = dict(e)
        elif name == "old_tasks_checked" and a.stopped is None:
            a.stopped = t
        elif name == "step_relaunching":
            a.relaunching = t
        elif name == "job_requeue_requested":
            a.requeued = t
        elif name == "no_replacement":
            a.no_replacement = True
    return attempts, last_time, ended


def compute(job_id: int, events: Iterable[Mapping[str, Any]], now: float | None = None) -> Ledger:
    """The ledger of one job from its decision records (in the order written). `now` closes a job that
    is still running (else the last record's time is the end)."""
    attempts, last_time, ended = _attempts(events)
    ledger = Ledger(job_id, attempts=len(attempts), ended=ended)
    if not attempts:
        ledger.notes.append("no attempt started yet")
        return ledger
    end = max(last_time or 0.0, now if now is not None and not ended else 0.0)
    ledger.start, ledger.end = attempts[0].launched, end
    ledger.progress_seen = any(a.first_step() is not None for a in attempts)
    steps = [s for a in attempts if (s := a.step_s()) is not None]
    typical_step = statistics.median(steps) if steps else None
    cursor = ledger.start
    # resumed_at[i]: the first step of the first attempt from i on that reported progress. Built once, from
    # the end, so that pairing each attempt with the one that resumed it is linear in the attempts (searching
    # the later attempts for each was quadratic: hours of CPU for a hostile file of 500,000 restarts).
    resumed_at: list[int | None] = [None] * (len(attempts) + 1)
    for i in range(len(attempts) - 1, -1, -1):
        s = attempts[i].first_step()
        resumed_at[i] = s if s is not None else resumed_at[i + 1]

    def span(until: float | None, category: Badput | None) -> float:
        """Account [cursor, until] (clamped to the job's end) to `category` (None: productive)."""
        nonlocal cursor
        t = min(max(cursor, until if until is not None else cursor), end)
        if category is None:
            ledger.productive_s += t - cursor
        else:
            ledger.add(category, t - cursor)
        seconds, cursor = t - cursor, t
        return seconds

    def carve(seconds: float, reported: float, source: Badput | None, category: Badput) -> None:
        """Move the reported blocked time (at most the span it happened in) from `source` to `category`."""
        moved = min(max(0.0, reported), seconds)
        if source is None:
            ledger.productive_s -= moved
        else:
            ledger.badput_s[source.value] -= moved
        ledger.add(category, moved)

    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        e = a.ended or {}
        decided = _num(e, "decided_at") or (nxt.launched if nxt else end)
        first_at, last_at = _num(e or a.progress or {}, "first_progress_at"), _num(e, "last_progress_at")
        step = a.step_s() or typical_step or 0.0
        cause = str((a.fault or {}).get("cause", ""))[:MAX_CAUSE_CHARS]
        # The fault: Slurm's mark of a node; a hang began at the last progress; else the step's end.
        if a.fault_marks:
            fault_at = min(a.fault_marks)
        elif cause == "hang" and last_at is not None:
            fault_at = last_at
        else:
            fault_at = decided
        span(a.launched, Badput.OTHER)
        window_start = None if first_at is None else max(a.launched, first_at - step)
        before: dict[str, float] | None = None  # badput so far, when this attempt's fault starts costing
        if not ledger.progress_seen:
            # No progress source at all: the wrapper's own categories only; the step's time is taken as work.
            span(fault_at, None)
            ledger.lost_work_known = False
        elif window_start is None:
            span(fault_at, Badput.REINIT)  # never reached its first step
        else:
            # The checkpoint load happens before the first step: reported, it is `restore`, not `reinit`.
            carve(span(window_start, Badput.REINIT), a.blocked("restore_s"), Badput.REINIT, Badput.RESTORE)
            # Steps kept may run past the fault (a node marked bad while the step still trains and saves):
            # those are work, and only the time after the last kept step counts as detection.
            window = max(0.0, min(decided, end) - cursor)
            if a.fault is None:
                # Ended without a fault (success, or stopped): what it did is kept; the tail is other.
                carve(
                    span(last_at if last_at is not None else fault_at, None),
                    a.blocked("checkpoint_s"),
                    None,
                    Badput.CHECKPOINT,
                )
            else:
                kept = _kept_steps(a, resumed_at[i + 1])
                if kept is None or not step:
                    span(fault_at, Badput.OTHER)
                    ledger.lost_work_known = False
                    ledger.notes.append(f"attempt {a.number}: lost work unknown (no later progress)")
                else:
                    # Saves block the steps that are kept; those of redone steps are lost work anyway.
                    carve(
                        span(cursor + min(window, kept * step), None),
                        a.blocked("checkpoint_s"),
                        None,
                        Badput.CHECKPOINT,
                    )
                    before = dict(ledger.badput_s)
                    lost = span(fault_at, Badput.LOST_WORK)
                    a.ended = {**e, "lost_s": lost}
        if before is None:
            before = dict(ledger.badput_s)
        span(decided, Badput.DETECTION if a.fault is not None else Badput.OTHER)
        if a.fault is None:
            span(nxt.launched if nxt else end, Badput.OTHER)
            continue
        lost_s = _num(a.ended or {}, "lost_s")
        span(a.stopped or _num(a.fault, "time"), Badput.STOP)
        if a.requeued is not None:
            span(a.requeued, Badput.REPLACEMENT if a.no_replacement else Badput.OTHER)
            span(nxt.launched if nxt else end, Badput.REQUEUE)
        else:
            moved = nxt is not None and nxt.nodes != a.nodes and set(_names(nxt.nodes)) != set(_names(a.nodes))
            span(a.relaunching, Badput.REPLACEMENT if moved or a.no_replacement else Badput.OTHER)
            span(nxt.launched if nxt else end, Badput.OTHER)
        nodes = _names(a.fault.get("nodes"), MAX_FAULT_NODES)
        cost = {k: v - before.get(k, 0.0) for k, v in ledger.badput_s.items()}
        ledger.restarts.append(
            Restart(
                at=fault_at,
                attempt=a.number,
                cause=cause or "unknown",
                nodes=nodes,
                action="requeue" if a.requeued is not None else "stop" if nxt is None and ledger.ended else "relaunch",
                lost_s=lost_s,
                badput_s=sum(cost.values()),
                by_category=cost,
            )
        )
    span(end, Badput.OTHER)
    if not ledger.progress_seen:
        ledger.notes.append("the step reported no progress (no step counter, no heartbeat): lost work unknown")
    if len(ledger.notes) > MAX_NOTES:  # one per attempt at most: a screen of them says it
        more = len(ledger.notes) - MAX_NOTES
        ledger.notes[MAX_NOTES:] = [f"... and {more} more note(s)"]
    by_number: dict[int, _Attempt] = {}
    for b in reversed(attempts):  # the first attempt of a number, as a search from the start would find
        by_number[b.number] = b
    for r in ledger.restarts:  # the next attempt's reinit is part of what the fault cost
        nxt_a = by_number.get(r.attempt + 1)
        if nxt_a is not None and nxt_a.first_step() is not None:
            first_at = _num(nxt_a.ended or nxt_a.progress or {}, "first_progress_at")
            step = nxt_a.step_s() or typical_step or 0.0
            if first_at is not None:
                reinit = max(0.0, first_at - step - nxt_a.launched)
                restore = min(reinit, nxt_a.blocked("restore_s"))
                r.badput_s += reinit
                for cat, v in ((Badput.REINIT, reinit - restore), (Badput.RESTORE, restore)):
                    if v > 0:
                        r.by_category[cat.value] = r.by_category.get(cat.value, 0.0) + v
    return ledger


def _kept_steps(a: _Attempt, resumed: int | None) -> int | None:
    """Steps of attempt `a` that the next attempt with progress (it resumed at step `resumed`) did not redo
    (it restarted after them)."""
    first = a.first_step()
    if first is None or resumed is None:
        return None
    last = _int(a.ended or {}, "last_step")
    done = (last - first + 1) if last is not None else resumed - first
    return max(0, min(resumed - first, done))


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
