"""The hang watch: no progress from the step past the hang clock's deadline (hang.py) stops it at once.

The clock reads the progress stream; the user's log rules take precedence, so with any rule configured the
built-in detection is off. Before a silence becomes a hang the step's tasks are counted (one srun on its nodes,
~1 s), in a thread started a little before the deadline so that the count is ready when the deadline comes and
the loop never waits on it. A step whose tasks have all ended is not hung but over: its srun waits on a process
that escaped it and holds its output (proctrack/pgid): the verdict asks the runner to reap that process (REAP),
and srun ends on its own. A real
hang is attributed (evidence.py: stacks, process states, the flight recorder) before the verdict: a hung step
cannot save or finish, so it gets no grace.
"""

from __future__ import annotations

import time

from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.base import Act, Probe, StepView, Verdict
from hpresilience.autoresume.watch.evidence import HangInvestigator
from hpresilience.autoresume.watch.hang import HangClock, HangDue
from hpresilience.autoresume.watch.table import WatchContext

# Before a silence becomes a hang the step's tasks are counted: started this long before the deadline (at most a
# quarter of the threshold), so the declaration is not late for it.
LIVENESS_LEAD_S = 5.0


class HangWatch:
    name = "hang"

    def __init__(
        self,
        clock: HangClock,
        investigator: HangInvestigator,
        reporter: Reporter,
        evidence_timeout_s: float,
    ) -> None:
        self.clock = clock
        self.investigator = investigator
        self.reporter = reporter
        self.evidence_timeout_s = evidence_timeout_s
        self.look: Probe[bool | None] | None = None  # the task count for the deadline in its tag

    def start(self, step: StepView) -> None:
        self.look = None
        self.clock.reset()

    def _lead(self) -> float:
        return min(LIVENESS_LEAD_S, (self.clock.threshold() or 0.0) / 4)

    def _look_due(self, deadline: float) -> bool:
        return not self.clock.rechecking() and (self.look is None or self.look.tag != deadline)

    def wait_s(self, now: float) -> float | None:
        """Never sleep past the deadline, nor past the moment the task count before it must start."""
        deadline = self.clock.deadline()
        if deadline is None:
            return None
        ahead = deadline - now
        lead = self._lead()
        if ahead > lead and self._look_due(deadline):
            ahead -= lead
        return ahead

    def poll(self, now: float, step: StepView) -> Verdict | None:
        due = self._due(now, step)
        if due is None or isinstance(due, Verdict):
            return due
        hang = self.investigator(step, due)
        return Verdict(self.name, Act.STOP_NOW, f"no progress for {due.silent_s:.0f} s", hang=hang)

    def _due(self, now: float, step: StepView) -> HangDue | Verdict | None:
        """A hang is due at the clock's deadline, if the step still has tasks then; if it has none, the verdict
        that reaps what escaped it."""
        deadline = self.clock.deadline()
        if deadline is None:
            return None
        if now >= deadline - self._lead() and self._look_due(deadline):
            self.look = Probe(deadline, lambda: self.investigator.tasks_alive(step), "step_task_count_failed")
        due = self.clock.check(now)
        if due is None or due.rechecked or self.look is None:
            return due
        look, self.look = self.look, None
        if look.result(self.evidence_timeout_s) is not False:
            return due  # alive, or not known (a node that does not answer is the hang path's to name)
        self.reporter.decision(
            "step_tasks_ended",
            attempt=step.attempt,
            silent_s=round(due.silent_s, 1),
            threshold_s=round(due.threshold_s, 1),
            why="no task of the step is left; srun waits on a process that escaped it",
        )
        self.clock.dismiss(time.monotonic())
        return Verdict(self.name, Act.REAP, "no task of the step is left", nodes=tuple(step.nodes))


def detector(ctx: WatchContext) -> HangWatch | None:
    w = ctx.opts.watch
    # Log rules no longer turn it off (issue 32): `hang_detection: false` is the one way (options.hang_detection).
    if not ctx.opts.hang_detection:
        return None
    clock = HangClock(ctx.progress, w.hang_floor_s, w.hang_interval_factor, w.hang_first_step_s)
    return HangWatch(clock, ctx.investigator, ctx.reporter, w.hang_evidence_timeout_s)
