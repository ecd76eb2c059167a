"""What the wrapper reads while it judges its allocation: the job's own nodes by name, never the cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.runner import CountingRunner
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_capacity import capacity_for
from tests.conftest import node_read

pytestmark = pytest.mark.integration


def test_unhealthy_reads_only_the_jobs_nodes(cluster: DevCluster, slurm: SlurmClient, tmp_path: Path) -> None:
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    job = slurm.wait_running(job_id)
    runner = CountingRunner.like(cluster.client().runner)
    client = SlurmClient(runner)
    assert client.version
    runner.calls.clear()
    cap, _, _ = capacity_for(client, job_id, tmp_path)
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    assert cap.unhealthy(job) == {"n2"}
    assert runner.commands() == [node_read(cluster, "n[1-2]")]
