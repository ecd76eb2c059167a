"""The systemd watchdog is pinged from its own thread while a long check runs, and stops when a cycle hangs;
`agent --once` (Slurm's HealthCheckProgram) remembers when active checks last ran, across processes."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpresilience.agent.daemon import Agent
from hpresilience.agent.settings import AgentSettings
from hpresilience.agent.watchdog import WatchdogPinger
from hpresilience.health.base import CheckResult, Kind, Status
from hpresilience.slurm.client import SlurmClient


class Collector:
    """Stands in for the hardware checks: passive checks pass at once, the active run takes `active_s`."""

    def __init__(self, active_s: float = 0.0) -> None:
        self.active_s = active_s
        self.active_runs: list[tuple[float, float]] = []

    def passive(self) -> Sequence[CheckResult]:
        return [CheckResult("passive_ok", "system", Kind.PASSIVE, Status.OK)]

    def active(self) -> Sequence[CheckResult]:
        start = time.monotonic()
        time.sleep(self.active_s)
        self.active_runs.append((start, time.monotonic()))
        return [CheckResult("stress", "system", Kind.ACTIVE, Status.OK, duration_s=self.active_s)]

    def wait_event(self, timeout: float) -> bool:
        time.sleep(timeout)
        return False


def test_pings_continue_through_a_long_cycle_and_stop_when_it_overruns() -> None:
    sent: list[float] = []
    w = WatchdogPinger(cycle_timeout_s=0.6, interval_s=0.05, send=lambda s: sent.append(time.monotonic())).start()
    try:
        w.cycle_started()
        start = time.monotonic()
        time.sleep(0.4)
        assert [t for t in sent if t > start + 0.1], "no ping while the cycle (within its timeout) ran"
        time.sleep(0.6)  # now past cycle_timeout_s: a hung check must let systemd restart the agent
        quiet_since = time.monotonic()
        time.sleep(0.3)
        assert not [t for t in sent if t > quiet_since]
        w.cycle_ended()
        time.sleep(0.3)
        assert [t for t in sent if t > quiet_since + 0.3 - 0.01]
    finally:
        w.stop()


def test_a_stalled_loop_outside_any_cycle_is_not_pinged_for() -> None:
    w = WatchdogPinger(cycle_timeout_s=100, interval_s=0.05, send=lambda s: None)
    w.beat()
    now = time.monotonic()
    assert w.alive(now) and not w.alive(now + 2.0)


@pytest.mark.integration
def test_agent_pings_the_watchdog_while_an_active_check_outlasts_watchdog_sec(
    slurm: SlurmClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WatchdogSec=0.4 s, an active check of 1.5 s: systemd still hears WATCHDOG=1 during the check."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.1)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    collector = Collector(active_s=1.5)
    settings = AgentSettings(
        node_name="n1", state_dir=str(tmp_path / "state"), metrics_address="", passive_interval_s=5
    )
    agent = Agent(settings, slurm, collector)
    pings: list[float] = []
    t = threading.Thread(target=agent.run)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while not collector.active_runs and time.monotonic() < deadline:
            try:
                if sock.recv(200) == b"WATCHDOG=1":
                    pings.append(time.monotonic())
            except TimeoutError:
                pass
    finally:
        agent.stop()
        t.join(timeout=10)
        sock.close()
    assert collector.active_runs, "the active check never ran"
    start, end = collector.active_runs[0]
    assert [p for p in pings if start < p < end], "no watchdog ping while the active check ran"


@pytest.mark.integration
def test_once_runs_do_not_repeat_active_checks_within_the_interval(slurm: SlurmClient, tmp_path: Path) -> None:
    """Two separate `--once` processes (here two Agents on the same state directory): only the first stresses."""
    settings = AgentSettings(node_name="n1", state_dir=str(tmp_path), metrics_address="", active_interval_s=3600)
    first, second = Collector(), Collector()
    Agent(settings, slurm, first).cycle()
    Agent(settings, slurm, second).cycle()
    assert len(first.active_runs) == 1 and second.active_runs == []
    # Once the interval has passed, they run again. A healthy cycle asks Slurm nothing, so the two cycles
    # above can take well under a millisecond: wait the interval out rather than assume it has gone by.
    time.sleep(0.06)
    # The first run drained n1 for its checks and resumed it: slurmctld shows it NOT_RESPONDING until its next
    # ping (about a second), and active checks run only on an idle node.
    deadline = time.monotonic() + 15
    while not slurm.node("n1").is_idle and time.monotonic() < deadline:
        time.sleep(0.2)
    Agent(settings.model_copy(update={"active_interval_s": 0.05}), slurm, second).cycle()
    assert len(second.active_runs) == 1
