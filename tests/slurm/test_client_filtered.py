"""SlurmClient's filtered reads on the real 4-node devcluster: each names what it asks for, and reads the
same records as the whole-table JSON read."""

from __future__ import annotations

import dataclasses

import pytest

from hpresilience.errors import SlurmError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.runner import CountingRunner
from hpresilience.testing.devcluster import DevCluster
from tests.conftest import job_read, node_read

pytestmark = pytest.mark.integration


def counting(cl: DevCluster) -> tuple[SlurmClient, CountingRunner]:
    runner = CountingRunner.like(cl.client().runner)
    client = SlurmClient(runner)
    assert client.version
    runner.calls.clear()
    return client, runner


def test_named_nodes_read_the_same_as_the_whole_table(cluster: DevCluster, slurm: SlurmClient) -> None:
    """Failing under a job, drained by an operator, DOWN: flags, reasons, times and addresses are equal on
    the filtered text path and the full JSON path of the same cluster."""
    job = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 60")
    slurm.wait_running(job)
    slurm.set_node_state(["n2"], "fail", "Action:Replace xid=79 (hpresilience)")
    slurm.set_node_state(["n3"], "drain", "operator: bad fan x=1 [rack 3]")
    # n4's slurmd is alive, so DOWN lasts only until its next registration (ReturnToService=2; slurmctld asks
    # every node to register every few ping rounds): on 24.11 that came before the first read once, and between
    # two reads once. Compare reads taken while n4 was DOWN and the whole table stayed the same.
    for _ in range(5):
        slurm.set_node_state(["n4"], "down", "Not responding")
        full = {n.name: n for n in slurm.nodes()}
        client, runner = counting(cluster)
        named = client.nodes(["n4", "n1", "n2", "n3"])
        if {n.name: n for n in slurm.nodes()} == full and full["n4"].has("DOWN"):
            break
    assert [n.name for n in named] == ["n4", "n1", "n2", "n3"]
    for n in named:
        assert n == full[n.name], n.name
    assert runner.commands() == [node_read(cluster, "n[1-4]")]
    assert named[2].is_failing and named[3].is_drained and named[0].has("DOWN")
    (j,) = [x for x in slurm.jobs() if x.job_id == job]
    # The text form (22.05) carries no flags; the JSON one (23.02+) does.
    assert dataclasses.replace(client.job(job), flags=()) == dataclasses.replace(j, flags=())


def test_poll_of_a_step_names_only_its_nodes(cluster: DevCluster) -> None:
    """What the wrapper polls every interval: the step's nodes by name, nothing else."""
    client, runner = counting(cluster)
    client.nodes(["n1", "n2"])
    client.node("n3")
    assert runner.commands() == [node_read(cluster, "n[1-2]"), node_read(cluster, "n3")]


def test_unknown_node_is_a_clear_error_and_known_nodes_leaves_it_out(cluster: DevCluster) -> None:
    client, _ = counting(cluster)
    with pytest.raises(SlurmError, match=r"unknown node.*nosuch"):
        client.nodes(["n1", "nosuch"])
    with pytest.raises(SlurmError, match="unknown node"):
        client.node("nosuch")
    assert [n.name for n in client.known_nodes(["nosuch", "n2", "n1"])] == ["n2", "n1"]


def test_job_reads_name_the_job(cluster: DevCluster, slurm: SlurmClient) -> None:
    job = slurm.sbatch("-N1", "-o", "/dev/null", "--wrap", "sleep 60")
    client, runner = counting(cluster)
    assert client.wait_running(job).job_id == job
    assert all(c == job_read(cluster, job) for c in runner.commands())
    assert client.job_or_none(999_999_999) is None
    with pytest.raises(SlurmError, match="not known"):
        client.job(999_999_999)


def test_out_of_service_count_and_idle_listings(cluster: DevCluster, slurm: SlurmClient) -> None:
    slurm.set_node_state(["n3"], "drain", "operator: bad fan")
    client, _ = counting(cluster)
    assert [n.name for n in client.nodes_out_of_service()] == ["n3"]
    assert [n.name for n in client.nodes_out_of_service(also=["n1", "nosuch"])] == ["n3", "n1"]
    assert client.node_count() == 4
    assert client.idle_nodes("debug") == ["n1", "n2", "n4"]
