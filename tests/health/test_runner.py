"""The runner: timeouts kill process groups, exceptions become unknown, unknown never asks for an action."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from hpresilience.health.base import (
    AnyCheck,
    Check,
    CheckContext,
    CheckOptions,
    CheckResult,
    Kind,
    Status,
)
from hpresilience.health.runner import run_checks, run_one
from hpresilience.proc import run as run_command
from hpresilience.reasons import Action


class Fn(Check[CheckOptions]):
    family = "test"

    def __init__(
        self, name: str, fn: Callable[[AnyCheck], CheckResult], timeout: float = 5.0, kind: Kind = Kind.PASSIVE
    ) -> None:
        super().__init__(CheckOptions(timeout_s=timeout), CheckContext())
        self.name = name  # type: ignore[misc]
        self.kind = kind  # type: ignore[misc]
        self.fn = fn

    def run(self) -> CheckResult:
        return self.fn(self)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def test_exception_becomes_unknown_with_no_action() -> None:
    def boom(c: AnyCheck) -> CheckResult:
        raise RuntimeError("sysfs exploded")

    r = run_one(Fn("boom", boom))
    assert (r.status, r.action) == (Status.UNKNOWN, Action.NONE) and "sysfs exploded" in r.reason


def test_unknown_or_warn_claiming_replace_is_stripped_of_the_action() -> None:
    for status in (Status.UNKNOWN, Status.WARN, Status.OK, Status.NOT_APPLICABLE):

        def liar(c: AnyCheck, s: Status = status) -> CheckResult:
            return c.result(s, "x", Action.REPLACE, "k", True)

        r = run_one(Fn("liar", liar))
        assert r.action == Action.NONE and not r.certain


def test_fail_without_action_cannot_be_certain() -> None:
    r = run_one(Fn("f", lambda c: c.result(Status.FAIL, "x", Action.NONE, "k", True)))
    assert r.status == Status.FAIL and not r.certain


def test_non_result_return_is_unknown() -> None:
    r = run_one(Fn("weird", lambda c: "ok"))  # type: ignore[arg-type,return-value]
    assert r.status == Status.UNKNOWN


def test_timeout_kills_the_whole_process_group_and_returns_unknown(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"

    def hang(c: AnyCheck) -> CheckResult:
        # A shell that starts a grandchild and ignores SIGTERM: only a group SIGKILL ends both.
        run_command(["sh", "-c", f"trap '' TERM; sleep 60 & echo $! > {pidfile}; echo $$ >> {pidfile}; wait"], 60)
        return c.ok("never")

    t0 = time.monotonic()
    [r] = run_checks([Fn("hang", hang, timeout=1.0)])
    assert time.monotonic() - t0 < 30  # not the 60 s the command would take
    assert r.status == Status.UNKNOWN and r.action == Action.NONE and "timed out after 1 s" in r.reason
    assert r.evidence["killed_process_groups"] == 1
    pids = [int(p) for p in pidfile.read_text().split()]
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids)


def test_command_timeout_inside_a_check_kills_its_group() -> None:
    t0 = time.monotonic()
    res = run_command(["sh", "-c", "sleep 30 & wait"], 0.5)
    assert res.timed_out and res.returncode is None and time.monotonic() - t0 < 20


def test_passive_checks_run_side_by_side_active_ones_in_order() -> None:
    order: list[str] = []

    def slow(name: str) -> Callable[[AnyCheck], CheckResult]:
        def fn(c: AnyCheck) -> CheckResult:
            order.append(name + ":start")
            time.sleep(0.4)
            order.append(name + ":end")
            return c.ok(name)

        return fn

    checks = [
        Fn("p1", slow("p1")),
        Fn("p2", slow("p2")),
        Fn("a1", slow("a1"), kind=Kind.ACTIVE),
        Fn("a2", slow("a2"), kind=Kind.ACTIVE),
    ]
    results = run_checks(checks)
    assert [r.check for r in results] == ["p1", "p2", "a1", "a2"]
    assert order.index("p2:start") < order.index("p1:end")  # overlapped
    assert order.index("a1:end") < order.index("a2:start")  # serial


def test_a_hung_check_does_not_hold_up_the_others() -> None:
    def hang(c: AnyCheck) -> CheckResult:
        time.sleep(30)
        return c.ok("late")

    t0 = time.monotonic()
    results = run_checks([Fn("hang", hang, timeout=0.3), Fn("quick", lambda c: c.ok("fine"))])
    # Abandoned, not waited for: far less than the 30 s the hung check would take.
    assert [r.status for r in results] == [Status.UNKNOWN, Status.OK] and time.monotonic() - t0 < 15


def test_stop_kills_the_active_check_in_flight_and_runs_no_more(tmp_path: Path) -> None:
    """A daemon told to stop mid-cycle (SIGTERM during a 30 s stress test) does not wait the check out: its
    process group is killed, the checks after it are not started, and both read `unknown`."""
    import threading

    pidfile = tmp_path / "pids"
    started = threading.Event()
    ran_second = []

    def stress(c: AnyCheck) -> CheckResult:
        started.set()
        run_command(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], 60)
        return c.ok("never")

    def second(c: AnyCheck) -> CheckResult:
        ran_second.append(True)
        return c.ok("ran")

    stop = threading.Event()

    def stop_soon() -> None:
        started.wait(10)
        time.sleep(0.3)
        stop.set()

    threading.Thread(target=stop_soon, daemon=True).start()
    t0 = time.monotonic()
    first, after = run_checks(
        [Fn("stress", stress, timeout=60, kind=Kind.ACTIVE), Fn("after", second, timeout=60, kind=Kind.ACTIVE)],
        stop=stop,
    )
    assert time.monotonic() - t0 < 20
    assert first.status == Status.UNKNOWN and "stopping" in first.reason
    assert after.status == Status.UNKNOWN and not ran_second
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid)
