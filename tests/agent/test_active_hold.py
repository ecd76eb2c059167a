"""Integration: active checks never share a node with a job. The agent drains its node under its own reason for
them and resumes it after; never on a node someone else drained or reserved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

from hpresilience.agent import hold
from hpresilience.agent.daemon import Agent
from hpresilience.agent.settings import AgentSettings
from hpresilience.health.base import CheckResult, Kind, Status
from hpresilience.slurm import reservations
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster

pytestmark = pytest.mark.integration


class Collector:
    """Stands in for the hardware checks; `during` runs inside the active checks (what a test does meanwhile)."""

    def __init__(self, during: Callable[[], None] = lambda: None) -> None:
        self.during = during
        self.active_runs: list[tuple[float, float]] = []

    def passive(self) -> Sequence[CheckResult]:
        return [CheckResult("passive_ok", "system", Kind.PASSIVE, Status.OK)]

    def active(self) -> Sequence[CheckResult]:
        start = time.time()
        self.during()
        self.active_runs.append((start, time.time()))
        return [CheckResult("system.stress", "system", Kind.ACTIVE, Status.OK)]

    def wait_event(self, timeout: float) -> bool:
        time.sleep(timeout)
        return False


def agent(slurm: SlurmClient, tmp_path: Path, name: str, collector: Collector) -> Agent:
    settings = AgentSettings(
        node_name=name, state_dir=str(tmp_path / "agent"), metrics_address="", active_interval_s=0.01
    )
    return Agent(settings, slurm, collector)


def test_a_job_submitted_during_the_active_checks_waits_until_they_are_over(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    seen: dict[str, object] = {}

    def submit_a_job() -> None:
        job = slurm.sbatch("--nodelist=n1", "--output=/dev/null", "--wrap=sleep 30")
        deadline = time.monotonic() + 10
        while not slurm.job(job).state_reason and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.5)  # the scheduler had its chance (bf_interval=2 on the devcluster)
        seen.update(job=job, pending=slurm.job(job).is_pending, node=slurm.node("n1"))

    collector = Collector(submit_a_job)
    agent(slurm, tmp_path, "n1", collector).cycle()
    [(_, ended)] = collector.active_runs
    n1 = seen["node"]
    assert seen["pending"], "a job started on n1 while its active checks ran"
    assert n1.has("DRAIN") and n1.reason == hold.HOLD_REASON  # type: ignore[attr-defined]
    job = slurm.wait_running(int(seen["job"]), timeout=30)  # type: ignore[call-overload]
    assert job.nodes == ("n1",)
    started = slurm.runner.run("squeue", "-h", "-j", str(job.job_id), "-o", "%S").stdout.strip()
    assert time.mktime(time.strptime(started, "%Y-%m-%dT%H:%M:%S")) >= int(ended)
    assert not slurm.node("n1").reason


def test_no_active_checks_on_a_node_someone_else_drained_or_reserved(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    slurm.set_node_state(["n2"], "drain", "maintenance: new NIC firmware")
    drained = Collector()
    agent(slurm, tmp_path / "n2", "n2", drained).cycle()
    assert drained.active_runs == [] and slurm.node("n2").reason == "maintenance: new NIC firmware"
    reservations.create_maintenance_reservation(slurm, "site-maint-n3", ["n3"], ["root"], 600)
    try:
        reserved = Collector()
        agent(slurm, tmp_path / "n3", "n3", reserved).cycle()
        assert reserved.active_runs == [] and not slurm.node("n3").has("DRAIN")
    finally:
        reservations.delete_reservation(slurm, "site-maint-n3")


def test_a_dry_run_runs_no_active_checks(cluster: DevCluster, slurm: SlurmClient, tmp_path: Path) -> None:
    """A dry run writes nothing to Slurm, so it cannot keep jobs off the node: it must not stress it either."""
    collector = Collector()
    a = agent(slurm, tmp_path, "n1", collector)
    a.settings = a.settings.model_copy(update={"dry_run": True})
    a.cycle()
    assert collector.active_runs == [] and not slurm.node("n1").reason


def test_a_job_that_lands_between_the_look_and_the_drain_cancels_the_run(
    cluster: DevCluster, slurm: SlurmClient
) -> None:
    looked = slurm.node("n4")
    assert looked.is_idle
    job = slurm.wait_running(slurm.sbatch("--nodelist=n4", "--output=/dev/null", "--wrap=sleep 30"))
    assert hold.take(slurm, looked) is None
    n4 = slurm.node("n4")
    assert not n4.has("DRAIN") and not n4.reason and slurm.job(job.job_id).is_running


def test_a_hold_left_by_a_run_killed_mid_check_is_given_back_by_the_next_run(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Slurm kills `agent --once` (HealthCheckProgram) after HealthCheckTimeout, here mid-stress-ng: the node
    stays drained under the hold. The next run, even one that runs no active checks, gives it back."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "agent": {"state_dir": str(tmp_path / "agent"), "metrics_address": ""},
                "health": {
                    "state_dir": str(tmp_path / "health"),
                    "profile": "generic",
                    # Long enough to be killed in the middle of, on one core: the killed agent's stress-ng, in a
                    # session of its own, ends at its own --timeout (30 s on every core by default).
                    "checks": {"system.stress": {"duration_s": 5, "cpu_workers": 1, "vm_workers": 0}},
                },
            }
        )
    )
    killed = subprocess.Popen(
        [sys.executable, "-m", "hpresilience", "--config", str(cfg), "agent", "--once", "--node", "n1"],
        env=cluster.env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not hold.is_hold(slurm.node("n1")):
            assert time.monotonic() < deadline and killed.poll() is None, "the agent never held n1"
            time.sleep(0.2)
        time.sleep(1.0)  # into the stress test
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=10)
    assert hold.is_hold(slurm.node("n1"))
    settings = AgentSettings(
        node_name="n1",
        state_dir=str(tmp_path / "agent"),
        metrics_address="",
        active_checks=False,
        resume_when_clear=False,
    )
    Agent(settings, slurm, Collector()).cycle()
    n1 = slurm.node("n1")
    assert not n1.has("DRAIN") and not n1.reason
