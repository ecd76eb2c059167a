"""The agent daemon and Slurm's HealthCheckProgram (`hpresilience agent --once`, a separate process) share one
state file per node: repeat counters, the last active-check time, whether a mark of ours is out. Each cycle
holds one lock from reading that state to writing it back, so neither overwrites what the other counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from hpresilience.agent.collector import HealthCollector
from hpresilience.agent.daemon import Agent
from hpresilience.agent.settings import AgentSettings
from hpresilience.config import load_config
from hpresilience.fileio import locked
from hpresilience.health.base import CheckResult
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.fakenode import FakeNode


class SlowChecks:
    """The node's real checks, slowed down between the state being read and written back (a stress check)."""

    def __init__(self, inner: HealthCollector, delay_s: float) -> None:
        self.inner, self.delay_s, self.cycles = inner, delay_s, 0

    def passive(self) -> Sequence[CheckResult]:
        out = self.inner.passive()
        time.sleep(self.delay_s)
        self.cycles += 1
        return out

    def active(self) -> Sequence[CheckResult]:
        return []

    def wait_event(self, timeout: float) -> bool:
        time.sleep(max(0.0, timeout))
        return False


def test_daemon_and_healthcheck_program_running_at_once_lose_no_repeat_count(tmp_path: Path) -> None:
    """A daemon cycling every 50 ms (each cycle 0.3 s of checks) while six `agent --once` processes run beside
    it: the fault's repeat counter ends at the number of cycles both ran together, none lost. Observe mode, so
    no Slurm is needed; the counters and the lock are the same in enforce."""
    node = FakeNode.make(tmp_path / "n1", "p5.48xlarge")
    node.inject("gpu_missing")
    agent_section = {
        "node_name": "n1",
        "state_dir": str(tmp_path / "agent"),
        "metrics_address": "",
        "active_checks": False,
        "mode": "observe",
        "required_repeats": 20,
    }
    cfg = yaml.safe_load((node.root / "config.yaml").read_text())
    cfg["agent"] = agent_section
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    health = load_config(config).health
    checks = SlowChecks(HealthCollector(health, sources=[]), 0.3)
    daemon = Agent(AgentSettings(**agent_section, passive_interval_s=0.05), SlurmClient(), checks)  # type: ignore[arg-type]
    t = threading.Thread(target=daemon.run)
    t.start()
    once_runs = 0
    try:
        env = {**os.environ, "HPRESILIENCE_CONFIG": str(config)}
        for _ in range(6):
            r = subprocess.run(
                [sys.executable, "-m", "hpresilience", "--config", str(config), "--json", "agent", "--once"],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            assert r.returncode == 0, r.stderr[-2000:]
            assert "skipped" not in json.loads(r.stdout)["why"]
            once_runs += 1
    finally:
        daemon.stop()
        t.join(timeout=30)
    state = json.loads(daemon.state_path.read_text())
    [(key, streak)] = [(k, v) for k, v in state["streaks"].items() if k.startswith("gpu.count")]
    assert streak == checks.cycles + once_runs, (key, streak, checks.cycles, once_runs)


def test_a_once_run_skips_when_the_daemon_holds_the_lock_past_its_wait(tmp_path: Path) -> None:
    """Slurm kills a HealthCheckProgram after 60 s: `--once` waits a bounded time, then skips its cycle
    (logged) instead of running the checks a second time beside the daemon's."""
    settings = AgentSettings(node_name="n1", state_dir=str(tmp_path), metrics_address="", mode="observe")  # type: ignore[arg-type]
    checks = SlowChecks(
        HealthCollector(load_config(FakeNode.make(tmp_path / "n", "generic").root / "config.yaml").health, sources=[]),
        0.0,
    )
    once = Agent(settings, SlurmClient(), checks, lock_wait_s=0.2)
    with locked(tmp_path / "state.lock", 1.0) as got:
        assert got
        d = once.cycle()
    assert d.kind == "none" and "skipped" in d.why and checks.cycles == 0
    assert once.cycle().kind == "none" and checks.cycles == 1
