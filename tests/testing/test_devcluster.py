"""Integration: the real local Slurm cluster and the Slurm client against it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from hpresilience.errors import EnvironmentMissing
from hpresilience.slurm import parse
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing import devaccounting, devconf, devprocs
from hpresilience.testing.devcluster import DevCluster, DevclusterError
from tests.conftest import TEST_BASE_PORT, full_node_read, require_slurm

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


def test_a_jobs_temporary_files_go_into_the_clusters_directory_not_the_machines_tmp(
    cluster: DevCluster, slurm: SlurmClient
) -> None:
    """torchrun makes a torchelastic_* directory in the temporary directory at every start and never removes it
    (a killed agent cannot): a test run left a hundred in /tmp. A job's tasks find the cluster's own, which goes
    with the cluster, sticky and open to all as /tmp is."""
    probe = "import tempfile; print(tempfile.mkdtemp(prefix='torchelastic_'))"
    res = slurm.runner.run("srun", "-N2", "--label", sys.executable, "-c", probe)
    made = [Path(line.split(":", 1)[1].strip()) for line in res.stdout.splitlines()]
    assert len(made) == 2 and all(d.parent == cluster.state_dir / "tmp" and d.is_dir() for d in made), made
    assert (cluster.state_dir / "tmp").stat().st_mode & 0o7777 == 0o1777


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
    res = slurm.runner.run(
        "srun", f"--jobid={job_id}", "-N2", f"--nodelist={keep},{new}", "--label", "printenv", "SLURMD_NODENAME"
    )
    assert sorted(line.split(":", 1)[1].strip() for line in res.stdout.splitlines()) == sorted([keep, new])
    assert drop not in {line.split(":", 1)[1].strip() for line in res.stdout.splitlines()}


def test_a_resize_from_inside_the_job_writes_no_file_in_the_callers_directory_or_in_tmp(
    cluster: DevCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wrapper resizes its job with SLURM_JOBID set and the user's directory as cwd: scontrol would write
    slurm_job_<id>_resize.sh and .csh there; nothing is written, there or in a directory of its own in /tmp."""
    client = cluster.client()
    job_id = client.sbatch("-N2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    job = client.wait_running(job_id)
    inside = SlurmClient(
        cluster.mode.command_runner(cluster.bin_dir, 15, 3, 0.3, {**cluster.env(), "SLURM_JOBID": str(job_id)})
    )
    monkeypatch.chdir(tmp_path)
    before = set(Path(tempfile.gettempdir()).glob("hpr-scontrol-*"))
    try:
        assert inside.shrink_job(job_id, [job.nodes[0]]).nodes == (job.nodes[0],)
        grown = inside.grow_job(job_id, 1, nodes=[job.nodes[1]], timeout=60)
        assert set(grown.nodes) == set(job.nodes)
    finally:
        client.cancel(job_id)
    assert list(tmp_path.iterdir()) == []
    assert set(Path(tempfile.gettempdir()).glob("hpr-scontrol-*")) == before


def test_timeout_of_unresponsive_slurmctld_is_one_clear_line(cluster: DevCluster, tmp_path: Path) -> None:
    """slurmctld frozen (SIGSTOP): the real sinfo hangs; the CLI kills it at the timeout, one line, exit 4."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("slurm: {command_timeout_s: 1.5, retries: 0}\n")
    pid = cluster.daemon_pids()["slurmctld"]
    os.kill(pid, 19)  # SIGSTOP
    try:
        started = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", "hpresilience", "--config", str(cfg), "nodes"],
            capture_output=True,
            text=True,
            timeout=60,
            env=cluster.env(),
        )
        took = time.monotonic() - started
    finally:
        os.kill(pid, 18)  # SIGCONT
    assert res.returncode == 4, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if not ln.startswith("{")]
    assert len(lines) == 1 and "timed out after 1.5 s" in lines[0] and full_node_read(cluster) in lines[0]
    assert took < 20


def test_nodes_command_lists_reason_as_json(cluster: DevCluster, slurm: SlurmClient) -> None:
    slurm.set_node_state(["n4"], "drain", "operator: memory errors")
    res = subprocess.run(
        [sys.executable, "-m", "hpresilience", "--json", "nodes", "--unavailable"],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster.env(),
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert [(d["name"], d["reason"]) for d in data] == [("n4", "operator: memory errors")]


def test_up_is_idempotent_and_down_leaves_no_process(tmp_path: Path) -> None:
    """A second, separate 2-node cluster with accounting: up twice, then down; none of its processes survive,
    MariaDB and slurmdbd included."""
    require_slurm()
    cl = DevCluster(state_dir=tmp_path / "c2", nodes=2, base_port=TEST_BASE_PORT + 200, accounting=True)
    try:
        took = cl.up(timeout=60)
        pids = cl.daemon_pids()
        assert set(pids) == {"slurmctld", "n1", "n2", "mariadbd", "slurmdbd"} and took < 30
        assert cl.up(timeout=60) < 10 and cl.daemon_pids() == pids
        job_id = cl.client().sbatch("-N2", "-o", "/dev/null", "--wrap", "srun sleep 300")
        cl.client().wait_running(job_id)
        time.sleep(0.5)
        assert len(cl.processes()) > len(pids)  # slurmstepd and the job's tasks are counted as ours
    finally:
        cl.down()
    assert cl.processes() == []
    assert not any(psutil.pid_exists(p) for p in pids.values())
    assert not (tmp_path / "c2").exists()


def test_down_stops_a_slurmd_started_with_its_conf_even_without_the_marker(tmp_path: Path) -> None:
    """A node's slurmd started by hand (no marker in its environment) with the cluster's slurm.conf is the
    cluster's: `down` stops it too, so it cannot hold the node's port for the next cluster on these ports."""
    require_slurm()
    cl = DevCluster(state_dir=tmp_path / "c5", nodes=1, base_port=TEST_BASE_PORT + 120, accounting=False)
    try:
        cl.up(timeout=60)
        assert cl.kill_node("n1")
        env = {k: v for k, v in cl.env().items() if k != devprocs.MARKER}  # as the cluster starts it, less the marker
        slurmd = devconf.slurm_tool("slurmd", cl.release, cl.bin_dir)
        subprocess.run([slurmd, "-f", str(cl.conf_path), "-N", "n1"], env=env, check=True, timeout=30)
        deadline = time.monotonic() + 20
        while not (by_hand := [p for p in psutil.process_iter(["name", "cmdline"]) if _slurmd_of(p, cl)]):
            assert time.monotonic() < deadline, "the slurmd started by hand did not appear"
            time.sleep(0.2)
    finally:
        cl.down()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in by_hand)


def _slurmd_of(p: psutil.Process, cl: DevCluster) -> bool:
    return p.info["name"] == "slurmd" and str(cl.conf_path) in (p.info["cmdline"] or [])


def test_a_cluster_that_does_not_come_up_leaves_no_process_holding_its_ports(tmp_path: Path) -> None:
    """n1's slurmd port taken (as an ephemeral client port once took it in a CI run): up fails with the nodes
    named, and stops what it started, MariaDB and slurmctld included, so the next cluster on those ports starts."""
    require_slurm()
    cl = DevCluster(state_dir=tmp_path / "c3", nodes=2, base_port=TEST_BASE_PORT + 250, accounting=True)
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind(("0.0.0.0", cl.node_port("n1")))
    blocker.listen()
    try:
        with pytest.raises(DevclusterError, match="n1"):
            cl.up(timeout=8)
        assert cl.processes() == []
    finally:
        blocker.close()
        cl.down()
    with socket.socket() as probe:  # slurmctld's port is free again (closed connections may linger in TIME_WAIT)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("0.0.0.0", cl.base_port))
        probe.listen()


def test_session_cluster_runs_accounting_and_cgroup_tracking(cluster: DevCluster) -> None:
    """The shared test cluster is production-like: slurmdbd accounting and proctrack/cgroup (on this kind of
    machine both are available; the suite must not silently fall back)."""
    config = cluster.client().config()
    assert config["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert config["ProctrackType"] == "proctrack/cgroup"
    assert {"mariadbd", "slurmdbd"} <= set(cluster.daemon_pids())


def _step_nodes(slurm: SlurmClient, job_id: int, nodes: list[str]) -> list[str]:
    res = slurm.runner.run(
        "srun",
        f"--jobid={job_id}",
        f"-N{len(nodes)}",
        f"--nodelist={','.join(nodes)}",
        "--label",
        "printenv",
        "SLURMD_NODENAME",
    )
    return sorted(line.split(":", 1)[1].strip() for line in res.stdout.splitlines())


def test_running_job_is_resized_five_times_with_a_step_on_each_node_set(
    cluster: DevCluster, slurm: SlurmClient
) -> None:
    """With slurmdbd a running job may be resized again and again (without it Slurm refuses every update of
    the job after the first resize): shrink, grow, shrink, grow, shrink, and a step runs on each node set."""
    job_id = slurm.sbatch("-N3", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    job = slurm.wait_running(job_id)
    nodes = sorted(job.nodes)
    # Grow with the node released longest ago: a node merged back into the job it just left can still be
    # running that job's release clean-up, which kills the new step's task there (seen here).
    idle = [n for n in cluster.names() if n not in nodes]
    seen = [_step_nodes(slurm, job_id, nodes)]
    for i, op in enumerate(["shrink", "grow", "shrink", "grow", "shrink"]):
        if op == "shrink":
            drop = next(n for n in reversed(nodes) if n != job.batch_host)
            nodes = sorted(n for n in nodes if n != drop)
            resized = slurm.shrink_job(job_id, nodes)
            idle.append(drop)
        else:
            spare = idle.pop(0)
            resized = slurm.grow_job(job_id, 1, nodes=[spare], timeout=60)
            nodes = sorted([*nodes, spare])
        assert sorted(resized.nodes) == nodes and resized.is_running, (op, i)
        seen.append(_step_nodes(slurm, job_id, nodes))
        assert seen[-1] == nodes
    assert len(seen) == 6 and slurm.job(job_id).job_id == job_id


def test_sacct_shows_the_job(cluster: DevCluster, slurm: SlurmClient) -> None:
    job_id = slurm.sbatch("-N1", "-o", "/dev/null", "--wrap", "true")
    deadline = time.monotonic() + 30
    while True:
        res = slurm.runner.run("sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "JobID,State")
        rows = [ln.split("|") for ln in res.stdout.split()]
        if [str(job_id), "COMPLETED"] in rows:
            break
        assert time.monotonic() < deadline, f"sacct never showed job {job_id} completed: {res.stdout!r}"
        time.sleep(0.5)


def test_cancelled_step_leaves_no_process_that_left_its_group(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """A task that forks a grandchild in a new session (as torchrun does with its workers): cancelling the
    step kills the grandchild too, as proctrack/cgroup does on real clusters."""
    marker = f"600.{os.getpid()}{time.monotonic_ns() % 10**6}"  # a sleep length no other process uses
    script = tmp_path / "task.sh"
    script.write_text(f"#!/bin/sh\nsetsid sleep {marker} &\nsleep 600\n")
    script.chmod(0o755)
    job_id = slurm.sbatch("-N2", "-o", "/dev/null", "--wrap", f"srun -N2 {script}")
    slurm.wait_running(job_id)

    def orphans() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]

    deadline = time.monotonic() + 30
    while len(orphans()) < 2:
        assert time.monotonic() < deadline, "the step's grandchildren never started"
        time.sleep(0.2)
    assert all(p.ppid() != 0 and os.getsid(p.pid) == p.pid for p in orphans())  # really in sessions of their own
    slurm.runner.run("scancel", f"{job_id}.0")
    deadline = time.monotonic() + 30
    while orphans():
        assert time.monotonic() < deadline, f"still alive after the step was cancelled: {orphans()}"
        time.sleep(0.2)
    slurm.cancel(job_id)


def test_ten_thousand_extra_nodes_are_served_while_real_nodes_run_jobs(tmp_path: Path) -> None:
    """--extra-nodes: slurmctld holds a production-size table of powered-down p5 nodes with realistic records
    (8 GPUs as gres, features, their own partition) and the real nodes still run jobs."""
    require_slurm()
    cl = DevCluster(
        state_dir=tmp_path / "big", nodes=2, base_port=TEST_BASE_PORT + 300, accounting=False, extra_nodes=10_000
    )
    try:
        cl.up(timeout=120)
        client = cl.client(timeout=60)
        names = client.runner.run("sinfo", "-h", "-N", "-o", "%N").stdout.split()
        assert len(set(names)) == 10_002
        rec = parse.parse_oneliner(client.runner.run("scontrol", "show", "node", "gpu-st-p5-9999", "-o").stdout)
        assert rec["Gres"] == "gpu:8" and "p5" in rec["AvailableFeatures"] and rec["Partitions"] == "p5"
        assert "POWERED_DOWN" in rec["State"] or "CLOUD" in rec["State"]
        res = client.runner.run("srun", "-N2", "--label", "printenv", "SLURMD_NODENAME")
        assert sorted(line.split(":", 1)[1].strip() for line in res.stdout.splitlines()) == ["n1", "n2"]
    finally:
        cl.down()
    assert cl.processes() == []


def test_accounting_asked_for_without_its_packages_names_the_apt_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(devaccounting.TOOLS, "mariadbd-not-installed-here", "mariadb-server")
    cl = DevCluster(state_dir=tmp_path / "c", nodes=1, base_port=TEST_BASE_PORT + 400, accounting=True)
    with pytest.raises(EnvironmentMissing, match="apt-get install -y slurmdbd mariadb-server"):
        cl.accounting.start(tmp_path, timeout=5)
    assert "mariadbd-not-installed-here" in devaccounting.missing_tools()


def test_a_mistyped_node_name_is_a_usage_error_naming_it(cluster: DevCluster) -> None:
    """`hpresilience replace n9` on a 4-node cluster: exit 2 (usage), not 4 (Slurm failed)."""
    res = subprocess.run(
        [sys.executable, "-m", "hpresilience", "replace", "n9"],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster.env(),
    )
    assert res.returncode == 2, res.stderr
    assert "unknown node(s): n9" in res.stderr
