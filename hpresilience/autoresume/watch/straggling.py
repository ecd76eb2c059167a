"""The straggler watch: a node slower than the others window after window (stragglers.py) is reported; with
exclude_stragglers it leaves the step at the next relaunch, or at once (stopped with the shutdown grace, as for
a tripped rule) when a hot spare is at hand.
"""

from __future__ import annotations

from collections.abc import Callable

from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.autoresume.watch.base import Act, StepView, Verdict
from hpresilience.autoresume.watch.rules import LogState, RuleTripped
from hpresilience.autoresume.watch.stragglers import Straggler, StragglerDetector
from hpresilience.autoresume.watch.table import WatchContext
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Job


class Stragglers:
    name = "stragglers"

    def __init__(
        self,
        settings: AutoResumeSettings,
        progress: ProgressStream,
        reporter: Reporter,
        client: SlurmClient,
        job_id: int,
        unhealthy: Callable[[Job], set[str]],
    ) -> None:
        self.w = settings
        self.progress = progress
        self.reporter = reporter
        self.client = client
        self.job_id = job_id
        self.unhealthy = unhealthy
        self.found: StragglerDetector | None = None

    def start(self, step: StepView) -> None:
        """After the progress stream's reset: its attempt start is the first window's."""
        w = self.w
        self.found = StragglerDetector(
            w.straggler_fraction, w.straggler_windows, w.straggler_window_s, self.progress.attempt_started
        )
        self.progress.listeners = [self.found.add]

    def wait_s(self, now: float) -> float | None:
        return None

    def poll(self, now: float, step: StepView) -> Verdict | None:
        if self.found is None:
            return None
        with self.progress.lock:
            found = self.found.tick(now)
        for s in found:
            self._report(s)
        if not found or not self.w.exclude_stragglers:
            return None
        nodes = tuple(s.node for s in found)
        slow = found[-1]
        why = f"{slow.node} is a straggler ({slow.ratio:g} x the other nodes' step time)"
        try:  # a hot spare at hand: swap now (the step stops as for a tripped rule); else at the next relaunch
            job = self.client.job(self.job_id)
            bad = self.unhealthy(job)
        except HPResilienceError:
            return Verdict(self.name, Act.NOTHING, why, nodes=nodes, leave_out=True)
        spares = [n for n in job.nodes if n not in step.nodes and n not in bad]
        if not spares:
            return Verdict(self.name, Act.NOTHING, why, nodes=nodes, leave_out=True)
        for s in found:
            self.reporter.decision("straggler_swap_now", node=s.node, spare=spares[0])
        trip = RuleTripped("straggler", LogState.SLOW, why, now)
        return Verdict(self.name, Act.STOP_GRACE, why, nodes=nodes, trip=trip, leave_out=True)

    def _report(self, s: Straggler) -> None:
        self.reporter.straggler(s.node, s.ratio)
        self.reporter.decision(
            "straggler_detected",
            node=s.node,
            ratio=s.ratio,
            slow_windows=s.slow_windows,
            windows=s.windows,
            fraction=self.w.straggler_fraction,
            exclude=self.w.exclude_stragglers,
        )


def detector(ctx: WatchContext) -> Stragglers:
    return Stragglers(ctx.opts.watch, ctx.progress, ctx.reporter, ctx.client, ctx.opts.job_id, ctx.unhealthy)
