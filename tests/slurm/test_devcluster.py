"""Integration: the real local Slurm cluster and the Slurm client against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.devcluster import DevCluster
from tests.conftest import TEST_BASE_PORT, require_slurm

pytestmark = pytest.mark.integration


def test_every_node_is_idle_with_its_own_address(cluster: DevCluster, slurm: SlurmClient) -> None:
    nodes = slurm.nodes()
    assert [n.name for n in nodes] == ["n1", "n2", "n3", "n4"]
    assert all(n.is_idle for n in nodes)
    assert [n.address for n in nodes] == ["127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"]


def test_four_node_srun_runs_on_each_node(cluster: DevCluster, slurm: SlurmClient) -> None:
    res = slurm.runner.run("srun", "-N4", "--label", "printenv", "SLURMD_NODENAME")
    names = sorted(line.split(":", 1)[1].strip() for line in res.stdout.splitlines())
    assert names == ["n1", "n2", "n3", "n4"]


def test_fail_with_reason_reads_back(cluster: DevCluster, slurm: SlurmClient) -> None:
    slurm.set_node_state(["n3"], "fail", "Action:Replace xid=79 test")
    n3 = slurm.node("n3")
    assert n3.has("FAIL") and n3.reason == "Action:Replace xid=79 test" and n3.is_unavailable
    assert all(n.is_idle for n in slurm.nodes(["n1", "n2", "n4"]))
    slurm.set_node_state(["n3"], "resume")
    assert slurm.node("n3").is_idle


def test_fail_under_a_running_job_is_failing_and_job_keeps_running(cluster: DevCluster, slurm: SlurmClient) -> None:
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 120")
    slurm.wait_running(job_id)
    slurm.set_node_state(["n2"], "fail", "Action:Replace test")
    n2 = slurm.node("n2")
    assert n2.is_failing and not n2.is_drained
    assert slurm.job(job_id).is_running


def test_shrink_then_grow_with_another_node_then_run_a_step(cluster: DevCluster, slurm: SlurmClient) -> None:
    """The foundation of auto-resume: a 2-node job drops a node and takes a different one, same job id."""
    assert slurm.permits_job_expansion()
    job_id = slurm.sbatch("-N2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    job = slurm.wait_running(job_id)
    keep, drop = job.nodes
    shrunk = slurm.shrink_job(job_id, [keep])
    assert shrunk.nodes == (keep,) and shrunk.job_id == job_id
    new = next(n for n in ["n1", "n2", "n3", "n4"] if n not in job.nodes)
    grown = slurm.grow_job(job_id, 1, nodes=[new], timeout=60)
    assert set(grown.nodes) == {keep, new} and grown.is_running
    res = slurm.runner.run("srun", f"--jobid={job_id}", "-N2", f"--nodelist={keep},{new}", "--label",
                           "printenv", "SLURMD_NODENAME")
    assert sorted(line.split(":", 1)[1].strip() for line in res.stdout.splitlines()) == sorted([keep, new])
    assert drop not in {line.split(":", 1)[1].strip() for line in res.stdout.splitlines()}


def test_timeout_of_unresponsive_slurmctld_is_one_clear_line(cluster: DevCluster, tmp_path: Path) -> None:
    """slurmctld frozen (SIGSTOP): the real sinfo hangs; the CLI kills it at the timeout, one line, exit 4."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("slurm: {command_timeout_s: 1.5, retries: 0}\n")
    pid = cluster.daemon_pids()["slurmctld"]
    os.kill(pid, 19)  # SIGSTOP
    try:
        started = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "hpresilience", "--config", str(cfg), "nodes"],
                             capture_output=True, text=True, timeout=60, env=cluster.env())
        took = time.monotonic() - started
    finally:
        os.kill(pid, 18)  # SIGCONT
    assert res.returncode == 4, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if not ln.startswith("{")]
    assert len(lines) == 1 and "timed out after 1.5 s" in lines[0] and "sinfo --json" in lines[0]
    assert took < 20


def test_nodes_command_lists_reason_as_json(cluster: DevCluster, slurm: SlurmClient) -> None:
    slurm.set_node_state(["n4"], "drain", "operator: memory errors")
    res = subprocess.run([sys.executable, "-m", "hpresilience", "--json", "nodes", "--unavailable"],
                         capture_output=True, text=True, timeout=60, env=cluster.env())
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert [(d["name"], d["reason"]) for d in data] == [("n4", "operator: memory errors")]


def test_up_is_idempotent_and_down_leaves_no_process(tmp_path: Path) -> None:
    """A second, separate 2-node cluster: up twice, then down; none of its processes survive."""
    require_slurm()
    cl = DevCluster(state_dir=tmp_path / "c2", nodes=2, base_port=TEST_BASE_PORT + 200)
    try:
        took = cl.up(timeout=60)
        pids = cl.daemon_pids()
        assert set(pids) == {"slurmctld", "n1", "n2"} and took < 30
        assert cl.up(timeout=60) < 10 and cl.daemon_pids() == pids
        job_id = cl.client().sbatch("-N2", "-o", "/dev/null", "--wrap", "srun sleep 300")
        cl.client().wait_running(job_id)
        time.sleep(0.5)
        assert len(cl.processes()) > len(pids)  # slurmstepd and the job's tasks are counted as ours
    finally:
        cl.down()
    assert cl.processes() == []
    assert not (tmp_path / "c2").exists()
