"""systemd's watchdog, pinged from its own thread while the agent's loop makes progress.

Pinging only between cycles lets one long active check (dcgmi diag -r 3, a stress run) outlast
WatchdogSec and get a healthy agent killed. Pinging from a thread unconditionally would hide a hung
agent. So the loop reports progress (`beat`) and when a cycle starts and ends; the thread pings while
the loop has beaten recently, or while the cycle in flight is younger than the longest a cycle may
take (agent.cycle_timeout_s, above every check's own timeout). A cycle stuck past that stops the pings,
and systemd restarts the agent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hpresilience.log import get_logger
from hpresilience.systemd import notify, watchdog_interval_s

log = get_logger("hpresilience.agent")


class WatchdogPinger:
    def __init__(
        self, cycle_timeout_s: float, interval_s: float | None = None, send: Callable[[str], object] = notify
    ) -> None:
        self.interval = watchdog_interval_s() if interval_s is None else interval_s
        self.cycle_timeout_s = cycle_timeout_s
        self._send = send
        self._lock = threading.Lock()
        self._beat = time.monotonic()
        self._cycle_started: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._starved_logged = False

    def beat(self) -> None:
        with self._lock:
            self._beat = time.monotonic()

    def cycle_started(self) -> None:
        with self._lock:
            self._cycle_started = self._beat = time.monotonic()

    def cycle_ended(self) -> None:
        with self._lock:
            self._cycle_started = None
            self._beat = time.monotonic()

    def alive(self, now: float | None = None) -> bool:
        """Should systemd hear from us now? The loop beat within two ping periods, or its cycle is in time."""
        t = time.monotonic() if now is None else now
        with self._lock:
            if self._cycle_started is not None:
                return t - self._cycle_started < self.cycle_timeout_s
            return self.interval is not None and t - self._beat < 2 * self.interval + 1.0

    def start(self) -> WatchdogPinger:
        if self.interval is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        assert self.interval is not None
        while not self._stop.wait(self.interval):
            if self.alive():
                self._send("WATCHDOG=1")
                self._starved_logged = False
            elif not self._starved_logged:
                self._starved_logged = True
                log.error(
                    "watchdog_pings_stopped",
                    cycle_timeout_s=self.cycle_timeout_s,
                    why="a check cycle ran past agent.cycle_timeout_s; systemd restarts the agent",
                )
