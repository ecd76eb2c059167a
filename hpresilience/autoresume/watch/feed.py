"""The step's output as the log rules and the decisions after the step read it: the rule set of one attempt,
fed by the two reader threads (launch/stream.py), ticked by the log-rule watch (logrules.py), and srun's own
error lines, kept for the classifier.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hpresilience.autoresume.watch.rules import RuleSet, RuleTripped
from hpresilience.slurm.srun import srun_error_lines

MAX_SRUN_ERRORS = 200


class RuleFeed:
    """The rule set of one attempt, shared by the two reader threads and the supervisor's ticks."""

    def __init__(self, rules: RuleSet, clock: Callable[[], float] = time.monotonic) -> None:
        self.rules = rules
        self.clock = clock
        self.lock = threading.Lock()
        self.tripped: list[RuleTripped] = []
        self.srun_errors: list[str] = []
        self.last_output = clock()

    def reset(self) -> None:
        with self.lock:
            self.rules.reset(self.clock())
            self.tripped = []
            self.srun_errors = []
            self.last_output = self.clock()

    def feed(self, text: str) -> None:
        now = self.clock()
        with self.lock:
            self.last_output = now
            if self.rules:
                self.tripped.extend(self.rules.feed_text(text, now))
            if len(self.srun_errors) < MAX_SRUN_ERRORS:
                self.srun_errors.extend(srun_error_lines(text))

    def tick(self) -> list[RuleTripped]:
        """Evaluate timers; returns (and forgets) every trip seen since the last call."""
        with self.lock:
            if self.rules:
                self.tripped.extend(self.rules.tick(self.clock()))
            out, self.tripped = self.tripped, []
            return out
