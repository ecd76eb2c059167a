"""Log rules with HyperPod's semantics, evaluated on a step's output with an injectable clock.

A `RuleSet` is compiled once from `logMonitoringConfiguration`. The wrapper feeds it the step's output
(`feed_text` for a block of whole lines, `feed` for one line) with the time it read them, calls `tick`
about once a second, and calls `reset` when an attempt starts. All three return `RuleTripped` events.

Matching follows HyperPod's agent: patterns are applied as `re.match` is (anchored at the start) to
each line without its terminator (which is why HyperPod's examples begin with `.*`), but on RE2
(`regex.py`): linear time, so no pattern can freeze the wrapper. Per line and rule, in this order: a
logPattern match records the time (and is a fault with faultOnMatch); a stopPattern match deactivates
the rule for the rest of the attempt, without a metric evaluation of that line; otherwise the first
capture group of the match is the metric.
Timers use strict `>`: a rule HANGs when `now - attempt start > expectedStartCutOffInSeconds` with no
match yet, or `now - last match > expectedRecurringFrequencyInSeconds`.

Speed: each rule runs its regex only on lines containing the pattern's longest required literal
(`prefilter.py`); a rule that only watches timers stops at the first matching line of a block.
"""

from __future__ import annotations

import enum
import operator as op
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpresilience.autoresume.settings import LogRuleSettings
from hpresilience.autoresume.watch.lines import first_matching_line, matching_lines
from hpresilience.autoresume.watch.prefilter import required_literal
from hpresilience.autoresume.watch.regex import RuleMatch, RulePattern
from hpresilience.log import get_logger
from hpresilience.slurm.srun import strip_task_labels

_log = get_logger("hpresilience.autoresume.rules")

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "gt": op.gt,
    "gteq": op.ge,
    "lt": op.lt,
    "lteq": op.le,
    "eq": op.eq,
}


class LogState(enum.Enum):
    WAITING = "WAITING"  # no match yet in this attempt
    HEALTHY = "HEALTHY"
    SLOW = "SLOW"  # metric breached the threshold metricEvaluationDataPoints times in a row
    HANGING = "HANGING"  # a timer ran out
    FAULTED = "FAULTED"  # faultOnMatch rule matched
    STOPPED = "STOPPED"  # stopPattern seen: inactive until the next attempt


@dataclass(frozen=True)
class RuleTripped:
    """A rule moved to HANGING, SLOW or FAULTED. `action` is the rule's: restart the step, or only log."""

    rule: str
    state: LogState
    detail: str
    at: float
    action: str = "restart"
    line: str | None = None

    @property
    def name(self) -> str:
        """HyperPod's name for the condition, e.g. `LogStateHanging_JobStart`."""
        return f"LogState{self.state.value.capitalize()}_{self.rule}"


class _Rule:
    """One compiled rule and its per-attempt state."""

    __slots__ = (
        "action",
        "active",
        "compare",
        "cutoff",
        "data_points",
        "fast_metric",
        "fault_on_match",
        "freq",
        "hang_latched",
        "invalid_metrics",
        "last_line",
        "last_match",
        "literal",
        "name",
        "pattern",
        "slow_count",
        "start",
        "state",
        "stop",
        "stop_literal",
        "threshold",
        "watches_lines",
    )

    def __init__(self, s: LogRuleSettings) -> None:
        self.name = s.name
        self.action = s.action
        # Captures cost RE2 a slower engine: only a metric rule asks for them.
        self.pattern = RulePattern(s.log_pattern, capture=s.operator is not None)
        self.literal = required_literal(s.log_pattern)
        self.stop = RulePattern(s.stop_pattern, capture=False) if s.stop_pattern is not None else None
        self.stop_literal = required_literal(s.stop_pattern) if s.stop_pattern is not None else ""
        self.cutoff = s.expected_start_cutoff_s
        self.freq = s.expected_recurring_frequency_s
        self.threshold = s.metric_threshold
        self.compare = _OPERATORS[s.operator] if s.operator is not None else None
        self.data_points = s.data_points
        self.fault_on_match = s.fault_on_match
        # A rule without metric or fault only needs to know whether a block matched at all.
        self.watches_lines = self.compare is not None or self.fault_on_match
        self.fast_metric = self.compare is not None and not self.fault_on_match and bool(self.literal)
        self.reset(0.0)

    def reset(self, now: float) -> None:
        self.active = True
        self.start = now
        self.last_match: float | None = None
        self.last_line: str | None = None
        self.slow_count = 0
        self.hang_latched = False
        self.invalid_metrics = 0
        self.state = LogState.WAITING

    def _trip(self, state: LogState, detail: str, now: float, line: str | None, out: list[RuleTripped]) -> None:
        self.state = state
        out.append(RuleTripped(self.name, state, detail, now, self.action, line))

    def scan(self, text: str, lines: Callable[[], list[str]], now: float, out: list[RuleTripped]) -> None:
        """Evaluate a block; `lines()` is the block split into lines, computed once and shared by the rules."""
        if not self.active:
            return
        stop_line: str | None = None
        if self.stop is not None:
            span = first_matching_line(text, self.stop, self.stop_literal)
            if span is not None:
                stop_line = text[span[0] : span[1]]
                text = text[: span[0]]
        if self.fast_metric and stop_line is None:
            self._scan_metric(lines(), now, out)
        else:
            for line, m in matching_lines(text, self.pattern, self.literal, not self.watches_lines):
                self._on_match(line, m, now, out, metric=True)
        if stop_line is not None:
            stop_m = self.pattern.match(stop_line)
            if stop_m is not None:
                self._on_match(stop_line, stop_m, now, out, metric=False)
            self.active = False
            self.state = LogState.STOPPED

    def _scan_metric(self, lines: list[str], now: float, out: list[RuleTripped]) -> None:
        """`_on_match` for every line of a metric rule, inlined: the hot loop of a chatty job.

        The filter, the regex calls and the iteration run in C (comprehension over `in`, `map`), so the
        Python work per line is one float and one comparison.
        """
        lit = self.literal
        candidates = [line for line in lines if lit in line]
        if not candidates:
            return
        compare = self.compare
        threshold = self.threshold
        need = self.data_points
        assert compare is not None and threshold is not None
        count = self.slow_count
        last_line: str | None = None
        for line, m in zip(candidates, map(self.pattern.match, candidates), strict=True):
            if m is None:
                continue
            last_line = line
            try:
                value = float(m.group(1) or "")  # a missed optional group: "" -> ValueError
            except (TypeError, ValueError):
                self._bad_metric(m, line)
                continue
            if compare(value, threshold):
                count += 1
                if count >= need:
                    count = 0
                    self._trip(LogState.SLOW, self._slow_detail(value), now, line, out)
            else:
                count = 0
                if self.state is LogState.SLOW:
                    self.state = LogState.HEALTHY
        self.slow_count = count
        if last_line is not None:
            self.last_match = now
            self.last_line = last_line
            self.hang_latched = False
            if self.state in (LogState.WAITING, LogState.HANGING):
                self.state = LogState.HEALTHY

    def _bad_metric(self, m: RuleMatch, line: str) -> None:
        # A capture that is not a number (optional group missed, "abc"): skipped, as HyperPod's agent does.
        self.invalid_metrics += 1
        if self.invalid_metrics == 1:
            _log.warning("log_rule_metric_not_a_number", rule=self.name, captured=m.group(1), line=line[:200])

    def _slow_detail(self, value: float) -> str:
        assert self.compare is not None and self.threshold is not None
        return (
            f"metric {value:g} {_op_name(self.compare)} {self.threshold:g} for "
            f"{self.data_points} consecutive data points"
        )

    def _on_match(self, line: str, m: RuleMatch, now: float, out: list[RuleTripped], metric: bool) -> None:
        self.last_match = now
        self.last_line = line
        self.hang_latched = False
        if self.state in (LogState.WAITING, LogState.HANGING):
            self.state = LogState.HEALTHY
        if self.fault_on_match:
            self._trip(LogState.FAULTED, "logPattern matched (faultOnMatch)", now, line, out)
            return
        if not metric or self.compare is None or self.threshold is None:
            return
        try:
            value = float(m.group(1) or "")  # a missed optional group: "" -> ValueError
        except (TypeError, ValueError):
            self._bad_metric(m, line)
            return
        if self.compare(value, self.threshold):
            self.slow_count += 1
            if self.slow_count >= self.data_points:
                self.slow_count = 0  # the next trip needs another full run of bad points
                self._trip(LogState.SLOW, self._slow_detail(value), now, line, out)
        else:
            self.slow_count = 0
            if self.state is LogState.SLOW:
                self.state = LogState.HEALTHY

    def tick(self, now: float, out: list[RuleTripped]) -> None:
        if not self.active or self.hang_latched:
            return
        if self.last_match is None:
            if self.cutoff is not None and now - self.start > self.cutoff:
                self.hang_latched = True
                self._trip(
                    LogState.HANGING,
                    f"no match within expectedStartCutOffInSeconds={self.cutoff:g} of the attempt's start",
                    now,
                    None,
                    out,
                )
        elif self.freq is not None and now - self.last_match > self.freq:
            self.hang_latched = True
            self._trip(
                LogState.HANGING,
                f"no match for {now - self.last_match:.0f} s (expectedRecurringFrequencyInSeconds={self.freq:g})",
                now,
                self.last_line,
                out,
            )


def _op_name(fn: Callable[[float, float], bool]) -> str:
    return next(k for k, v in _OPERATORS.items() if v is fn)


class RuleSet:
    """The rules of one job. Not thread-safe: one reader thread feeds it and ticks it."""

    def __init__(
        self,
        rules: Sequence[LogRuleSettings],
        *,
        strip_task_label: bool = False,
        max_line_chars: int = 65536,
        now: float = 0.0,
    ) -> None:
        self._rules = [_Rule(r) for r in rules]
        self._strip_label = strip_task_label
        self._max_line = max_line_chars
        self.reset(now)

    def __bool__(self) -> bool:
        return bool(self._rules)

    @property
    def names(self) -> list[str]:
        return [r.name for r in self._rules]

    def reset(self, now: float) -> None:
        """A new attempt starts now: every rule is active again, with no matches and no counts."""
        for r in self._rules:
            r.reset(now)

    def feed(self, line: str, now: float) -> list[RuleTripped]:
        """One line (its terminator optional) read at `now`; over-long lines are cut to max_line_chars."""
        if len(line) > self._max_line:
            line = line[: self._max_line]
        return self.feed_text(line.replace("\r", "\n"), now)

    def feed_text(self, text: str, now: float) -> list[RuleTripped]:
        """A block of whole lines separated by "\\n" (as `LineBuffer.push` returns), all read at `now`."""
        out: list[RuleTripped] = []
        if text:
            if self._strip_label:
                text = strip_task_labels(text)
            split: list[list[str]] = []

            def lines() -> list[str]:
                if not split:
                    parts = text.split("\n")
                    if parts[-1] == "":
                        parts.pop()  # the block's final newline ends the last line; it starts none
                    split.append(parts)
                return split[0]

            for r in self._rules:
                r.scan(text, lines, now, out)
        for r in self._rules:
            r.tick(now, out)
        return out

    def tick(self, now: float) -> list[RuleTripped]:
        """Evaluate the timers with no new output; call about once a second."""
        out: list[RuleTripped] = []
        for r in self._rules:
            r.tick(now, out)
        return out

    def states(self) -> dict[str, LogState]:
        return {r.name: r.state for r in self._rules}
