"""The numbers the integrity watch (integrity.py) judges, and how: a loss read from an output line, a robust
z-score of a loss against the window before it, and the step ranges the ranks are told to skip.

Pure functions and small values: the progress stream (progress.py) collects `LossSample`s from heartbeats
(`loss=`, `gnorm=`, and the replica check's `replica=ok|bad bad_rank= bad_node= ok_step=`) and from output lines
that print a loss (`step=12 loss=0.53`, the HF Trainer's `{'loss': 0.53, ...}`); integrity.py drains them.

Why median and MAD: a window's mean and standard deviation are pulled by the very spike they should expose
(one value 100 x the others doubles the mean), and a healthy curve's few large steps would widen them for a
whole window; the median and the median absolute deviation ignore up to half the window.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from dataclasses import dataclass

# Heartbeat fields this watch reads (progress.parse_heartbeat keeps them in Beat.checks, text as sent).
CHECK_KEYS = ("loss", "gnorm", "replica", "bad_rank", "bad_node", "ok_step")
# `loss=0.5`, `loss: 0.5`, `'loss': 0.5`, `"loss": nan`; not `val_loss`, `loss_scale` (their own metrics).
_LOSS = re.compile(
    r"(?<![\w])['\"]?loss['\"]?\s{0,4}[:=]\s{0,4}"
    r"([-+]?(?:nan|inf(?:inity)?|\d{1,30}(?:\.\d{0,30})?(?:e[-+]?\d{1,3})?|\.\d{1,30}(?:e[-+]?\d{1,3})?))(?![\w.])",
    re.IGNORECASE,
)
# 1.4826 x the MAD estimates a normal distribution's standard deviation.
MAD_SCALE = 1.4826
# A window this flat (a loss that no longer moves) would call any change a spike: its scale is at least this
# fraction of its median.
MIN_RELATIVE_SCALE = 0.01


@dataclass(frozen=True)
class LossSample:
    """One report: from `source` (rank<R> for a heartbeat, task<T> for an output line), at monotonic `at`.
    `fields`: a heartbeat's check fields; `loss`: an output line's loss (None for heartbeats)."""

    at: float
    source: str
    node: str
    step: int
    fields: tuple[tuple[str, str], ...]
    loss: float | None = None

    def value(self, key: str) -> str | None:
        return next((v for k, v in self.fields if k == key), None)

    def number(self, key: str) -> float | None:
        """A heartbeat field as a float (nan and inf kept: they are what is watched), None if absent or not one."""
        raw = self.value(key)
        try:
            return None if raw is None else float(raw)
        except ValueError:
            return None


def loss_in_line(body: str) -> float | None:
    """The loss an output line prints, else None (nan and inf included)."""
    m = _LOSS.search(body[:4096])
    return float(m.group(1)) if m else None


def robust_z(window: list[float] | deque[float], x: float) -> float:
    """How far `x` lies above the window's median, in robust standard deviations (negative: below)."""
    med = statistics.median(window)
    mad = statistics.median(abs(v - med) for v in window)
    scale = max(MAD_SCALE * mad, MIN_RELATIVE_SCALE * abs(med), 1e-12)
    return (x - med) / scale


class SpikeWatch:
    """One source's loss curve: `add` answers the z-score of a value that spikes (above `z` once at least
    `min_samples` came), else None. A spike does not enter the window (it would widen it for the next)."""

    def __init__(self, window: int, z: float, min_samples: int) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.z = z
        self.min_samples = min(min_samples, window)

    def add(self, x: float) -> float | None:
        if not math.isfinite(x):
            return None  # the caller judges non-finite values itself
        if len(self.values) >= self.min_samples:
            score = robust_z(self.values, x)
            if score > self.z:
                return score
        self.values.append(x)
        return None


def ranges_text(ranges: list[tuple[int, int]]) -> str:
    """`[(23, 25), (40, 40)]` -> `23-25,40-40` (HPR_SKIP_STEPS; torch/integrity.skip_steps reads it back)."""
    return ",".join(f"{a}-{b}" for a, b in ranges)
