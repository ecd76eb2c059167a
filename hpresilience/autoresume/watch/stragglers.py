"""Stragglers: a node whose ranks are slower than the rest of the job, window after window.

Per-rank step times come from the progress stream (heartbeats' work time, else their step time; else the
interval per step of a task's own output lines). Time is cut into windows of `window_s`; in each, a
node's value is the median of its ranks' samples, and it is slow in that window when it exceeds the
median of the *other* nodes' values by more than `fraction` (leave-one-out: with two nodes the job's
median would be their mean, and a 30 % slower node would sit only 15 % above it). A node slow in most
(more than half) of the last `windows` windows is a straggler; it is reported once per attempt.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from hpresilience.autoresume.progress import StepTime


@dataclass(frozen=True)
class Straggler:
    node: str
    ratio: float  # the node's step time over the other nodes' median, in the last slow window
    slow_windows: int
    windows: int


class StragglerDetector:
    def __init__(self, fraction: float, windows: int, window_s: float, start: float) -> None:
        self.fraction = fraction
        self.windows = windows
        self.window_s = window_s
        self.window_start = start
        self.current: dict[str, list[float]] = {}
        self.history: dict[str, deque[tuple[bool, float]]] = {}
        self.reported: set[str] = set()

    def add(self, sample: StepTime) -> None:
        if sample.node:
            self.current.setdefault(sample.node, []).append(sample.seconds)

    def tick(self, now: float) -> list[Straggler]:
        """Close every window that ended by `now`; the stragglers found for the first time."""
        found: list[Straggler] = []
        while now >= self.window_start + self.window_s:
            found += self._close()
            self.window_start += self.window_s
        return found

    def _close(self) -> list[Straggler]:
        values = {n: statistics.median(v) for n, v in self.current.items() if v}
        self.current = {}
        found: list[Straggler] = []
        if len(values) < 2:
            return found
        for node, value in values.items():
            others = statistics.median(v for n, v in values.items() if n != node)
            ratio = value / others if others > 0 else 1.0
            hist = self.history.setdefault(node, deque(maxlen=self.windows))
            hist.append((ratio > 1.0 + self.fraction, ratio))
            slow = sum(1 for s, _ in hist if s)
            if slow * 2 > self.windows and node not in self.reported:
                self.reported.add(node)
                found.append(Straggler(node, round(ratio, 3), slow, len(hist)))
        return found
