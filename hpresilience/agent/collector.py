"""The agent's collector: a health profile's checks and the XID event sources, as the daemon sees them.

`HealthCollector` implements the daemon's Collector protocol: `passive()` and `active()` run the profile's
checks and return their CheckResults unchanged (the guard acts on those that ask for an action),
`wait_event()` wakes the loop on a kernel-log or NVML fault event. It lives here, not in health/, so that
the health package knows nothing of the agent that uses it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hpresilience.health.base import AnyCheck, CheckResult, Kind, Mode
from hpresilience.health.events import KernelLogFollower, NvmlXidSource, XidEventSource
from hpresilience.health.profiles import build_checks, load_profile, make_context
from hpresilience.health.runner import run_checks
from hpresilience.health.settings import HealthSettings
from hpresilience.health.xid import FaultEvent
from hpresilience.log import get_logger

log = get_logger("hpresilience.agent")


def open_event_sources(settings: HealthSettings) -> list[XidEventSource]:
    """Kernel log (kmsg or the configured file) and, where the driver is there, NVML XID events."""
    sources: list[XidEventSource] = []
    path = settings.kernel_log or f"{settings.path.dev.rstrip('/')}/kmsg"
    try:
        sources.append(KernelLogFollower(path))
    except OSError as err:
        log.warning("kernel_log_not_followed", path=path, error=str(err))
    if settings.nvml in ("auto", "pynvml"):
        try:
            sources.append(NvmlXidSource())
        except Exception as err:  # noqa: BLE001 - no driver / no GPU: the kernel log still works
            log.info("nvml_events_unavailable", error=str(err))
    return sources


class HealthCollector:
    """Implements the agent's Collector protocol over a profile's checks and the XID event sources."""

    def __init__(
        self,
        settings: HealthSettings,
        profile: str | None = None,
        sources: Sequence[XidEventSource] | None = None,
    ) -> None:
        self.settings = settings
        self.ctx = make_context(settings)
        self.profile = load_profile(settings, profile, self.ctx.paths)
        self.ctx = make_context(settings, self.profile)
        self.passive_checks: list[AnyCheck] = build_checks(self.profile, self.ctx, (Kind.PASSIVE,))
        self.active_checks: list[AnyCheck] = [
            c for c in build_checks(self.profile, self.ctx, (Kind.ACTIVE,)) if c.kind == Kind.ACTIVE
        ]
        self.sources = list(sources) if sources is not None else open_event_sources(settings)
        self.last_events: list[FaultEvent] = []
        self.last_event_at: float | None = None
        self.stopping = threading.Event()

    @property
    def observe_only(self) -> frozenset[str]:
        """Checks set to `mode: observe` (health.checks.NAME.mode): their faults are logged and counted, never
        acted on."""
        return frozenset(n for n, o in self.profile.options.items() if o.mode is Mode.OBSERVE)

    def cancel(self) -> None:
        """Kill the checks in flight and run no more: the daemon is stopping."""
        self.stopping.set()

    def _run(self, checks: list[AnyCheck]) -> list[CheckResult]:
        self.ctx.clear_cache()
        out = []
        for r in run_checks(checks, stop=self.stopping):
            # The xid check reads the whole boot's log: the fault it reports was observed when the event
            # woke the loop, which is where the detection latency starts.
            if r.asks_action and r.check == "xid" and self.last_event_at is not None:
                r = replace(r, observed_at=self.last_event_at)
            out.append(r)
        return out

    def passive(self) -> Sequence[CheckResult]:
        return self._run(self.passive_checks)

    def active(self) -> Sequence[CheckResult]:
        return self._run(self.active_checks)

    def wait_event(self, timeout: float) -> bool:
        if not self.sources:
            time.sleep(max(0.0, timeout))
            return False
        deadline = time.monotonic() + max(0.0, timeout)
        share = 0.05 if len(self.sources) > 1 else None
        while True:
            for s in self.sources:
                left = deadline - time.monotonic()
                try:
                    events = s.poll(min(left, share) if share is not None else left)
                except Exception as err:  # noqa: BLE001 - a broken source must not stop the agent
                    log.warning("event_source_failed", source=type(s).__name__, error=str(err))
                    events = []
                if events:
                    self.last_events, self.last_event_at = events, time.time()
                    log.info("fault_event_seen", events=[e.key for e in events])
                    return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        for s in self.sources:
            s.close()

    def describe(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "passive": [c.name for c in self.passive_checks],
            "active": [c.name for c in self.active_checks],
            "sources": [type(s).__name__ for s in self.sources],
        }
