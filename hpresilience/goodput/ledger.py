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
from typing import Any

from hpresilience.goodput import inprocessparts
from hpresilience.goodput.inprocessparts import InProcessRecovery
from hpresilience.goodput.ledgertypes import (
    ENDINGS,
    LEDGER_VERSION,
    MAX_ABS,
    MAX_CAUSE_CHARS,
    MAX_FAULT_NODES,
    MAX_NOTES,
    Badput,
    Ledger,
    Restart,
    render,
)
from hpresilience.goodput.ledgertypes import names as _names
from hpresilience.goodput.ledgertypes import num as _num
from hpresilience.goodput.ledgertypes import whole as _int

__all__ = ["ENDINGS", "LEDGER_VERSION", "MAX_ABS", "Badput", "Ledger", "Restart", "compute", "render"]


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
    inprocess: list[InProcessRecovery] = field(default_factory=list)  # recovered in place (inprocessparts.py)
    decided: float | None = None  # an in-process attempt that fell back: its failed recovery's fault_seen
    fell_back: bool = False

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
        if name == "attempt_started" or inprocessparts.first_world(e):
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
        elif name == "fault_seen" and e.get("mode") == inprocessparts.ACTION:
            a.inprocess.append(InProcessRecovery(dict(e), a.fault_marks))
            a.fault_marks = []
        elif name == "fault_seen":
            a.fault = dict(e)
        elif name in inprocessparts.EVENTS:
            _inprocess(a, name, e, t)
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
        decided = _num(e, "decided_at") or a.decided or (nxt.launched if nxt else end)
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
        span(a.stopped or _num(a.fault, "time"), Badput.INPROCESS if a.fell_back else Badput.STOP)
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
    inprocessparts.account(ledger, ((a.number, a.inprocess) for a in attempts if a.inprocess), end)
    return ledger


def _inprocess(a: _Attempt, name: object, e: Mapping[str, Any], t: float) -> None:
    """An in-process mode's record into its attempt (inprocessparts.py)."""
    last = a.inprocess[-1] if a.inprocess else None
    if name == "inprocess_world_written":
        # The wrapper counts each world as an attempt (the relaunch after a fallback is numbered after the last
        # one): the attempt takes the newest world's number, so that the relaunch is its next.
        a.number = max(a.number, _int(e, "generation") or 0)
    elif name == "inprocess_replaced" and last is not None:
        last.replaced = t
    elif name == "inprocess_world_formed":
        if _int(e, "generation") == 1:
            a.progress = inprocessparts.progress_of(e)
        elif last is not None and last.formed is None:
            last.formed = dict(e)
    elif name == "inprocess_fallback":
        # The recoveries that never formed are what failed: the first of them is the fault the relaunch path
        # recovers from (its detection, then the in-process time spent in vain, then the relaunch).
        failed = [r for r in a.inprocess if r.formed is None]
        a.inprocess = [r for r in a.inprocess if r.formed is not None]
        first = failed[0] if failed else None
        a.fault = {**(first.fault if first else {}), "cause": "inprocess_fallback", "time": t}
        a.fault_marks = first.marks if first else a.fault_marks
        a.decided = _num(first.fault, "time") if first else t
        a.fell_back = True


def _kept_steps(a: _Attempt, resumed: int | None) -> int | None:
    """Steps of attempt `a` that the next attempt with progress (it resumed at step `resumed`) did not redo
    (it restarted after them)."""
    first = a.first_step()
    if first is None or resumed is None:
        return None
    last = _int(a.ended or {}, "last_step")
    done = (last - first + 1) if last is not None else resumed - first
    return max(0, min(resumed - first, done))
