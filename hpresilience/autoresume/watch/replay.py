"""After a restore, the steps the job redoes should give the losses they gave before the fault.

A relaunched step resumes from its last checkpoint and redoes the steps after it with the same data: their
losses, printed on the step's output (`step=41 loss=2.3104`, `step 41 | loss: 2.3104`), are what they were
in the attempt before. A restore that loaded other weights than the step it names (a stale save the checks
missed, a wrong tier, a data loader that did not resume) shows as a different loss at the same step. The
first `restore_loss_steps` replayed steps of each task are compared with the losses of the previous attempts;
a relative difference above `restore_loss_tolerance` is reported (`restore_loss_mismatch`), agreement too
(`restore_loss_matched`). Nothing is stopped: nondeterministic kernels, dropout seeded by wall time or a data
order that is not replayable legitimately differ, so this says, it does not act.

Bounded: at most MAX_STEPS (task, step) losses are kept; an unparsable or non-finite loss is skipped (NaN is
the NaN detector's business).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from hpresilience.autoresume.progress import output_counter
from hpresilience.autoresume.report import Reporter

MAX_STEPS = 20000
_LOSS = re.compile(r"\bloss\b['\"]?\s*[:=]\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")


@dataclass
class Replay:
    """What the comparison found in one attempt."""

    compared: list[tuple[int, int, float, float]] = field(default_factory=list)  # (task, step, before, now)
    mismatched: list[tuple[int, int, float, float]] = field(default_factory=list)


class LossReplay:
    def __init__(self, steps: int = 5, tolerance: float = 1e-3) -> None:
        self.steps = steps
        self.tolerance = tolerance
        self.before: dict[tuple[int, int], float] = {}  # losses of earlier attempts
        self.now: dict[tuple[int, int], float] = {}
        self.result = Replay()
        self._counted: dict[int, int] = {}  # task -> replayed steps compared so far

    def new_attempt(self) -> Replay:
        """Start the next attempt; what the one that ended found."""
        done = self.result
        for k, v in self.now.items():
            if len(self.before) < MAX_STEPS or k in self.before:
                self.before[k] = v
        self.now, self.result, self._counted = {}, Replay(), {}
        return done

    def line(self, task: int, body: str) -> None:
        """One output line of `task` (its label removed)."""
        if self.steps <= 0 or "loss" not in body:
            return
        found = output_counter(body)
        m = _LOSS.search(body)
        if found is None or found[0] != "step" or m is None:
            return
        try:
            loss = float(m.group(1))
        except ValueError:
            return
        if not math.isfinite(loss):
            return
        key = (task, found[1])
        if key not in self.now and len(self.now) < MAX_STEPS:
            self.now[key] = loss
        old = self.before.get(key)
        if old is None or self._counted.get(task, 0) >= self.steps:
            return
        self._counted[task] = self._counted.get(task, 0) + 1
        row = (task, found[1], old, loss)
        self.result.compared.append(row)
        if abs(loss - old) > self.tolerance * max(abs(old), abs(loss), 1e-12):
            self.result.mismatched.append(row)


def report_replay(reporter: Reporter, attempt: int, replay: Replay) -> None:
    """One decision for an attempt that redid steps with losses: matched, or the steps that differ."""
    if replay.mismatched:
        reporter.decision(
            "restore_loss_mismatch",
            attempt=attempt,
            compared=len(replay.compared),
            mismatched=[{"task": t, "step": s, "before": b, "now": n} for t, s, b, n in replay.mismatched[:10]],
        )
    elif replay.compared:
        reporter.decision("restore_loss_matched", attempt=attempt, compared=len(replay.compared))
