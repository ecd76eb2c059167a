"""Waiting with visible progress: what is awaited, and for how long so far."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger

T = TypeVar("T")
log = get_logger("hpresilience.wait")


class WaitTimeout(HPResilienceError):
    """A condition did not come true in time; the message says what was awaited."""


def wait_for(
    probe: Callable[[], T | None],
    what: str,
    timeout: float,
    interval: float = 0.2,
    progress_every: float = 5.0,
    on_progress: Callable[[str, float], None] | None = None,
) -> T:
    """Call `probe` until it returns something truthy; log progress every `progress_every` seconds."""
    started = time.monotonic()
    next_report = started + progress_every
    while True:
        value = probe()
        if value:
            return value
        now = time.monotonic()
        elapsed = now - started
        if elapsed >= timeout:
            raise WaitTimeout(f"timed out after {elapsed:.1f} s waiting for {what}")
        if now >= next_report:
            if on_progress is not None:
                on_progress(what, elapsed)
            else:
                log.info("still_waiting", what=what, waited_s=round(elapsed, 1), timeout_s=timeout)
            next_report = now + progress_every
        time.sleep(min(interval, max(0.0, timeout - elapsed)))
