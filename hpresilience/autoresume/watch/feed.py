"""The step's output as the log rules and the decisions after the step read it: the rule set of one attempt,
fed by the two reader threads (launch/stream.py), ticked by the log-rule watch (logrules.py), and srun's own
error lines, kept for the classifier, and the last lines each task wrote to stderr (the crash signature of
decide/crashloop.py).
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable

from hpresilience.autoresume.watch.replay import LossReplay
from hpresilience.autoresume.watch.rules import RuleSet, RuleTripped
from hpresilience.slurm.srun import srun_error_lines

MAX_SRUN_ERRORS = 200
TAIL_LINES = 8
TAIL_TASKS = 256  # tasks whose stderr tail is kept (the first to write): bounded memory at any scale
_LABEL = re.compile(r"^ *(\d{1,7}): ")
_SLURM_OWN = ("srun: ", "slurmstepd: ", "slurmstepd-")


class RuleFeed:
    """The rule set of one attempt, shared by the two reader threads and the supervisor's ticks."""

    def __init__(
        self, rules: RuleSet, clock: Callable[[], float] = time.monotonic, replay: LossReplay | None = None
    ) -> None:
        self.rules = rules
        self.replay = replay  # the losses of replayed steps (watch/replay.py), fed from stdout
        self.clock = clock
        self.lock = threading.Lock()
        self.tripped: list[RuleTripped] = []
        self.srun_errors: list[str] = []
        self.last_output = clock()
        self.err_tails: dict[int, deque[str]] = {}  # task (-1: unlabelled) -> its last stderr lines
        self.out_tail: deque[str] = deque(maxlen=TAIL_LINES)

    def reset(self) -> None:
        with self.lock:
            self.rules.reset(self.clock())
            self.tripped = []
            self.srun_errors = []
            self.last_output = self.clock()
            self.err_tails = {}
            self.out_tail = deque(maxlen=TAIL_LINES)

    def feed(self, text: str, stream: str = "stdout") -> None:
        now = self.clock()
        with self.lock:
            self.last_output = now
            if self.rules:
                self.tripped.extend(self.rules.feed_text(text, now))
            if len(self.srun_errors) < MAX_SRUN_ERRORS:
                self.srun_errors.extend(srun_error_lines(text))
            self._keep_tail(text, stream)

    def _keep_tail(self, text: str, stream: str) -> None:
        lines = text.splitlines()
        if stream == "stdout" and self.replay is not None and "loss" in text:
            for line in lines:
                if "loss" in line:
                    self.replay.line(*_split(line))
        for line in lines[-TAIL_LINES:] if stream == "stdout" else lines:
            task, body = _split(line)
            if not body.strip() or body.startswith(_SLURM_OWN):
                continue
            if stream == "stdout":
                self.out_tail.append(body[:512])
                continue
            tail = self.err_tails.get(task)
            if tail is None:
                if len(self.err_tails) >= TAIL_TASKS:
                    continue
                tail = self.err_tails[task] = deque(maxlen=TAIL_LINES)
            tail.append(body[:512])

    def error_tail(self, task: int | None = None) -> list[str]:
        """The last lines of `task`'s stderr; else of the lowest task that wrote any; else of stdout."""
        with self.lock:
            if task is not None and self.err_tails.get(task):
                return list(self.err_tails[task])
            if self.err_tails:
                return list(self.err_tails[min(self.err_tails)])
            return list(self.out_tail)

    def tick(self) -> list[RuleTripped]:
        """Evaluate timers; returns (and forgets) every trip seen since the last call."""
        with self.lock:
            if self.rules:
                self.tripped.extend(self.rules.tick(self.clock()))
            out, self.tripped = self.tripped, []
            return out


def _split(line: str) -> tuple[int, str]:
    """(task, the line without its srun label); task -1 for an unlabelled line."""
    m = _LABEL.match(line)
    return (int(m.group(1)), line[m.end() :]) if m else (-1, line)
