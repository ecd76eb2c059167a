"""A node slowed for real, not by a sleep in the training script: a CPU quota on the node's cgroup
(`devcluster slow NODE --cpu F`) makes its rank's compute take longer, and the straggler watch names that node
within a minute; `--cpu 1` gives the node its CPU back."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing import nodecpu
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_recipe_integration import Recipe
from tests.autoresume.test_sick_integration import leftovers, rank_process  # noqa: F401

pytestmark = pytest.mark.integration


def need_cpu_cgroup() -> None:
    if nodecpu.hierarchy() is None:
        pytest.skip("no writable cpu cgroup controller here (needs root and cgroup v1 cpu or v2 cpu)")


def cgroup_of(pid: int) -> str:
    """The process's cgroup in the cpu controller's hierarchy (v1: the `cpu` line, v2: the unified `0::` line)."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    v1 = [path for _, controllers, path in lines if "cpu" in controllers.split(",")]
    return v1[0] if v1 else next((path for n, _, path in lines if n == "0"), "")


def test_a_node_given_a_twentieth_of_a_cpu_is_flagged_as_a_straggler_within_a_minute(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, leftovers: list[int]
) -> None:
    """Every rank burns 0.1 s of its own CPU per step (INJECT_CPU_WORK): the quota, not the script, slows one.
    5 % of a CPU, not 20 %: on a shared 2-core machine under a load of 12 every process gets about 1/6 of a core,
    and a 20 % quota then no longer bites (seen: ratio 1.28, or no straggler at all within 75 s)."""
    need_cpu_cgroup()
    run = Recipe(
        cluster,
        tmp_path,
        steps=2000,
        inject=True,
        extra_env={"INJECT_CPU_WORK": "1", "TRAIN_STEP_SLEEP": "0.1"},
    )
    leftovers.append(run.job_id)
    victim = ""
    try:
        run.wait(lambda: "step=1\n" in run.out, "step 1", timeout=60)
        job = slurm.job(run.job_id)
        victim = next(n for n in job.nodes if n != job.batch_host)  # the wrapper's own node keeps its CPU
        ranks = [p for p in (rank_process(run.job_id, r) for r in (0, 1)) if p is not None]
        [rank] = [p for p in ranks if p.environ().get("SLURMD_NODENAME") == victim]
        assert cgroup_of(rank.pid).endswith(nodecpu.cgroup_name(cluster.base_port, victim))
        cluster.slow(victim, cpu=0.05)
        began = time.time()
        assert nodecpu.quota(cluster.base_port, victim) == 0.05
        flagged = run.wait(lambda: run.named("straggler_detected"), "straggler_detected", timeout=75)
        took = flagged[0]["time"] - began
        print(f"{victim} at 0.05 CPU: flagged as a straggler after {took:.1f} s, ratio {flagged[0]['ratio']}")
        assert [f["node"] for f in flagged] == [victim]
        assert took < 60 and flagged[0]["ratio"] > 1.2  # the default straggler_fraction: 0.2
    finally:
        if victim:
            cluster.slow(victim, cpu=1)
        slurm.cancel(run.job_id)
    assert nodecpu.quota(cluster.base_port, victim) is None


def hpr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpresilience", *args], capture_output=True, text=True, timeout=60)


def test_the_cli_limits_a_nodes_cpu_and_one_cpu_removes_the_limit(cluster: DevCluster) -> None:
    need_cpu_cgroup()
    where = ("--state-dir", str(cluster.state_dir))
    slurmd = psutil.Process(cluster.daemon_pids()["n3"])
    assert cgroup_of(slurmd.pid).endswith(nodecpu.cgroup_name(cluster.base_port, "n3"))
    try:
        res = hpr("devcluster", "slow", "n3", "--cpu", "0.3", *where)
        assert res.returncode == 0 and "n3: 0.3 of one CPU" in res.stdout, res.stderr
        assert nodecpu.quota(cluster.base_port, "n3") == pytest.approx(0.3)
        assert nodecpu.quota(cluster.base_port, "n2") is None  # the other nodes keep theirs
    finally:
        res = hpr("devcluster", "slow", "n3", "--cpu", "1", *where)
    assert res.returncode == 0 and "CPU quota removed" in res.stdout, res.stderr
    assert nodecpu.quota(cluster.base_port, "n3") is None
    bad = hpr("devcluster", "slow", "n3", "--cpu", "0", *where)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "--cpu" in bad.stderr, bad.stderr
    # A link cap needs a netns cluster: said in one line.
    rate = hpr("devcluster", "slow", "n3", "--rate", "1mbit", *where)
    assert rate.returncode != 0 and "--isolation netns" in rate.stderr, rate.stderr
