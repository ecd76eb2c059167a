"""Running checks: timeouts, exceptions, and the rule that an agent-side error never asks for a replacement.

Passive checks run side by side (each in its own thread, so one hung read does not hold up the
others); active checks run one after another, because two stress tests at once measure neither. A
check that overruns its timeout is abandoned: the process groups it started are killed, and its
result is `unknown`. Python cannot kill the thread itself, which is why checks do their blocking work
in subprocesses or in bounded reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from hpresilience.health.base import (
    AnyCheck,
    CheckResult,
    Kind,
    NotApplicable,
    RequiredMissing,
    Status,
)
from hpresilience.log import get_logger
from hpresilience.proc import ProcessTracker, bind_tracker
from hpresilience.reasons import Action

log = get_logger("hpresilience.health")


class _Run:
    def __init__(self, check: AnyCheck) -> None:
        self.check = check
        self.tracker = ProcessTracker()
        self.result: CheckResult | None = None
        self.started = 0.0
        self.thread = threading.Thread(target=self._target, name=f"check:{check.name}", daemon=True)

    def start(self) -> None:
        self.started = time.monotonic()
        self.thread.start()

    def _target(self) -> None:
        bind_tracker(self.tracker)
        try:
            self.result = run_one(self.check)
        finally:
            bind_tracker(None)


def _unknown(check: AnyCheck, reason: str, **evidence: object) -> CheckResult:
    return CheckResult(check.name, check.family, check.kind, Status.UNKNOWN, Action.NONE, reason, dict(evidence))


def sanitize(check: AnyCheck, res: CheckResult) -> CheckResult:
    """Enforce the invariants a check cannot be trusted with."""
    if res.check != check.name:
        res = replace(res, check=check.name, family=check.family, kind=check.kind)
    if res.status != Status.FAIL and (res.action != Action.NONE or res.certain):
        # Only a failure asks for an action; not knowing in particular is no evidence against the hardware.
        res = replace(res, action=Action.NONE, certain=False)
    if res.status == Status.FAIL and res.action == Action.NONE and res.certain:
        res = replace(res, certain=False)
    return res


def run_one(check: AnyCheck) -> CheckResult:
    """Run one check in the calling thread: exceptions become `unknown`, absence becomes `not_applicable`."""
    t0 = time.monotonic()
    try:
        res = check.run()
        if not isinstance(res, CheckResult):
            res = _unknown(check, f"check returned {type(res).__name__}, not a CheckResult")
    except NotApplicable as na:
        res = CheckResult(check.name, check.family, check.kind, Status.NOT_APPLICABLE, reason=str(na))
    except RequiredMissing as rm:
        # The profile says the device must be here; a reboot often brings a device back, so confirm first.
        res = CheckResult(
            check.name,
            check.family,
            check.kind,
            Status.FAIL,
            Action.REBOOT,
            f"required but absent: {rm}",
            {},
            f"{check.name}:absent",
            False,
        )
    except Exception as err:  # noqa: BLE001 - a broken check is an unknown result, never a crash
        log.warning("check_raised", check=check.name, error=str(err), kind=type(err).__name__)
        res = _unknown(check, f"check error: {type(err).__name__}: {err}", error=type(err).__name__)
    return replace(sanitize(check, res), duration_s=time.monotonic() - t0)


def _collect(run: _Run, deadline: float, stop: threading.Event | None = None) -> CheckResult:
    # Joined in slices when the caller may stop us: a daemon told to stop must not wait out a 30 s stress test.
    while True:
        left = deadline - time.monotonic()
        run.thread.join(max(0.0, min(left, 0.2)) if stop is not None else max(0.0, left))
        if not run.thread.is_alive() or left <= 0 or (stop is not None and stop.is_set()):
            break
    if run.thread.is_alive() or run.result is None:
        killed = run.tracker.kill_all()
        if stop is not None and stop.is_set():
            log.info("check_cancelled", check=run.check.name, killed_groups=killed)
            res = _unknown(run.check, "cancelled: the agent is stopping", killed_process_groups=len(killed))
            return replace(res, duration_s=time.monotonic() - run.started)
        log.warning("check_timed_out", check=run.check.name, timeout_s=run.check.timeout_s, killed_groups=killed)
        res = _unknown(
            run.check,
            f"timed out after {run.check.timeout_s:g} s",
            timeout_s=run.check.timeout_s,
            killed_process_groups=len(killed),
        )
        return replace(res, duration_s=time.monotonic() - run.started)
    return run.result


def run_checks(
    checks: Sequence[AnyCheck], parallel: bool = True, stop: threading.Event | None = None
) -> list[CheckResult]:
    """Run checks and return one result per check, in the order given. Never raises for a check's sake.
    Once `stop` is set, the running checks are killed and the rest are not started (both `unknown`)."""
    results: dict[int, CheckResult] = {}
    passive = [(i, c) for i, c in enumerate(checks) if c.kind == Kind.PASSIVE]
    active = [(i, c) for i, c in enumerate(checks) if c.kind != Kind.PASSIVE]
    if parallel:
        runs = [(i, _Run(c)) for i, c in passive]
        for _, r in runs:
            r.start()
        for i, r in runs:
            results[i] = _collect(r, r.started + r.check.timeout_s, stop)
    else:
        active = passive + active
    for i, c in active:
        if stop is not None and stop.is_set():
            results[i] = _unknown(c, "not run: the agent is stopping")
            continue
        r = _Run(c)
        r.start()
        results[i] = _collect(r, r.started + c.timeout_s, stop)
    out = [results[i] for i in range(len(checks))]
    for res in out:
        log.debug(
            "check_finished",
            check=res.check,
            status=res.status.value,
            action=res.action.value,
            duration_s=round(res.duration_s, 3),
            reason=res.reason,
        )
    return out
