"""The log-rule watch: the user's rules (HyperPod's logMonitoringConfiguration) over the step's output.

The reader threads feed each block of whole lines to the rule set (`RuleFeed.feed`, from launch/stream.py); the
detector ticks the timers and reports every rule that fired. The first that fired with action `restart` stops
the step with the shutdown grace (the ranks may still save); the others are only reported. srun's own error
lines are kept with the feed (feed.py), for the decisions after the step.
"""

from __future__ import annotations

from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.base import Act, StepView, Verdict
from hpresilience.autoresume.watch.feed import RuleFeed
from hpresilience.autoresume.watch.rules import RuleTripped
from hpresilience.autoresume.watch.table import WatchContext


class LogRules:
    name = "rules"

    def __init__(self, feed: RuleFeed, reporter: Reporter) -> None:
        self.feed = feed
        self.reporter = reporter

    def start(self, step: StepView) -> None:
        pass  # the runner resets the feed before the reader threads start (its trips and srun's errors)

    def wait_s(self, now: float) -> float | None:
        return None

    def poll(self, now: float, step: StepView) -> Verdict | None:
        stop: RuleTripped | None = None
        for t in self.feed.tick():
            self.reporter.decision(
                "rule_fired",
                rule=t.rule,
                state=t.state.value,
                condition=t.name,
                detail=t.detail,
                action=t.action,
                attempt=step.attempt,
            )
            if t.action == "restart" and stop is None:
                stop = t
        if stop is None:
            return None
        return Verdict(self.name, Act.STOP_GRACE, f"{stop.name}: {stop.detail}", trip=stop)


def detector(ctx: WatchContext) -> LogRules:
    return LogRules(ctx.feed, ctx.reporter)
