"""Integration: the controller repairs real devcluster nodes through the `script` provider."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from hpresilience.controller.loop import Controller
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.controller.conftest import Scripts, history, settings_for, wait_until, write_scripts

pytestmark = pytest.mark.integration


def test_operator_replace_repairs_node_and_no_kill_job_keeps_running_elsewhere(
    cluster: DevCluster,
    slurm: SlurmClient,
    scripts: Scripts,
    tmp_path: Path,
    start_controller: Callable[[Controller], Controller],
) -> None:
    """scontrol update node=n2 state=fail reason=Action:Replace under a 2-node --no-kill job: the controller
    waits for the job, forces n2 down after the limit (the job goes on with n1), restarts n2's slurmd,
    passes the gate and resumes n2 idle under the same name."""
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    before = slurm.node("n2").slurmd_start_time
    registry = CollectorRegistry()
    ctl = start_controller(Controller(settings_for(scripts, tmp_path / "state"), slurm, registry=registry))
    slurm.set_node_state(["n2"], "fail", "Action:Replace")

    wait_until(lambda: history(tmp_path / "state"), "the repair of n2 to finish")
    # slurmctld may still flag the new slurmd not-responding for a ping or two after the resume.
    n2 = wait_until(lambda: n if (n := slurm.node("n2")).is_idle else None, "n2 to be idle", timeout=30)
    assert n2.reason == "" and n2.slurmd_start_time != before
    job = slurm.job(job_id)
    assert job.is_running and job.nodes == ("n1",)
    assert scripts.calls == ["n2 replace"] and scripts.gate_calls == ["n2"]
    done = history(tmp_path / "state")
    assert [(h["node"], h["outcome"], h["attempts"]) for h in done] == [("n2", "repaired", 1)]
    assert done[0]["last_health"]["passed"] is True
    assert not (tmp_path / "state" / "nodes" / "n2.json").exists()
    assert (
        registry.get_sample_value(
            "hpr_controller_repairs_total", {"provider": "script", "action": "replace", "outcome": "repaired"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "hpr_controller_repair_duration_seconds_count", {"provider": "script", "action": "replace"}
        )
        == 1
    )
    assert ctl.records == {}


def test_forced_down_waits_for_the_limit_while_jobs_run(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path
) -> None:
    """A failing node is left to its jobs until forced_down_after_s, and only then set DOWN."""
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    slurm.set_node_state(["n2"], "fail", "Action:Reboot")
    ctl = Controller(settings_for(scripts, tmp_path / "state", forced_down_after_s=60), slurm)
    ctl.cycle(now=1000.0)
    ctl.cycle(now=1059.0)
    assert ctl.records["n2"].step == "pending" and not ctl.records["n2"].forced_down
    assert slurm.job(job_id).nodes == ("n1", "n2")
    ctl.cycle(now=1061.0)
    assert ctl.records["n2"].forced_down and scripts.calls == []
    wait_until(lambda: slurm.job(job_id).nodes == ("n1",), "n2 to leave the job")
    assert slurm.job(job_id).is_running


def test_gate_failure_escalates_reboot_then_replace_then_gives_up(
    cluster: DevCluster,
    slurm: SlurmClient,
    scripts: Scripts,
    tmp_path: Path,
    start_controller: Callable[[Controller], Controller],
) -> None:
    """A node failing its health gate after each repair is never resumed: reboot, then replace, then it is
    left DOWN+DRAIN with a reason that says why and asks for a person."""
    scripts.set_gate("n3", "fail")
    state = tmp_path / "state"
    start_controller(Controller(settings_for(scripts, state, ladder=["reboot", "replace"]), slurm))
    slurm.set_node_state(["n3"], "fail", "Action:Reboot")

    def given_up() -> bool:
        p = state / "nodes" / "n3.json"
        return p.exists() and json.loads(p.read_text())["step"] == "given_up"

    wait_until(given_up, "the controller to give n3 up", timeout=90)
    rec = json.loads((state / "nodes" / "n3.json").read_text())
    assert scripts.calls == ["n3 reboot", "n3 replace"] and scripts.gate_calls == ["n3", "n3"]
    assert rec["attempt"] == 2 and rec["last_health"]["passed"] is False
    n3 = slurm.node("n3")
    assert n3.has("DRAIN") and not n3.is_idle
    assert "gave up after 2 attempt(s)" in n3.reason and "needs a person" in n3.reason
    assert "health gate failed" in n3.reason and "Action:" not in n3.reason
    assert history(state) == []


def test_controller_killed_mid_repair_finishes_it_exactly_once(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """SIGKILL while the provider acts; the restarted controller waits for the node instead of acting again,
    gates it and resumes it: one provider call in all."""
    scripts = write_scripts(tmp_path / "scripts", cluster, provider_delay_s=2.0)
    state = tmp_path / "state"
    settings = settings_for(scripts, state).model_dump(mode="json")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"controller": settings}))
    env = dict(cluster.env(), HPRESILIENCE_CONFIG=str(cfg))
    log1 = open(tmp_path / "controller1.log", "w")  # noqa: SIM115 - closed below
    argv = [sys.executable, "-m", "hpresilience", "controller", "run"]
    first = subprocess.Popen(argv, env=env, stdout=log1, stderr=subprocess.STDOUT)
    try:
        slurm.set_node_state(["n2"], "fail", "Action:Replace")
        wait_until(lambda: scripts.calls, "the provider to be called")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
        log1.close()
    assert json.loads((state / "nodes" / "n2.json").read_text())["step"] == "acting"
    second = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: history(state), "the restarted controller to finish the repair")
    finally:
        second.send_signal(signal.SIGTERM)
        out, _ = second.communicate(timeout=30)
    assert second.returncode == 0, out
    assert scripts.calls == ["n2 replace"], out
    assert [(h["node"], h["outcome"]) for h in history(state)] == [("n2", "repaired")]
    wait_until(lambda: slurm.node("n2").is_idle, "n2 to be idle", timeout=30)
    assert "repair_action_resumed" in out and "controller_stopped" in out


def test_reason_not_ours_is_never_touched(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path
) -> None:
    """A node drained by an operator for maintenance (no Action: word) is left alone."""
    slurm.set_node_state(["n4"], "drain", "maintenance: new NIC firmware")
    ctl = Controller(settings_for(scripts, tmp_path / "state"), slurm)
    ctl.cycle()
    ctl.cycle()
    assert ctl.records == {} and scripts.calls == []
    assert slurm.node("n4").reason == "maintenance: new NIC firmware"
