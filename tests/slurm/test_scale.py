"""Integration at production size: 10,000 powered-down p5 nodes beside the 4 real ones (one cluster for the
module). The filtered reads answer correctly there, and what they read is sized by the question."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from hpresilience.errors import SlurmError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.runner import CountingRunner
from hpresilience.testing.devcluster import DevCluster
from tests.conftest import TEST_BASE_PORT, job_read, require_slurm

pytestmark = pytest.mark.integration
EXTRA = 10_000


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    # No accounting: nothing here resizes a job, and the cluster is up in seconds.
    cl = DevCluster(
        state_dir=tmp_path_factory.mktemp("scale") / "cluster",
        nodes=4,
        base_port=TEST_BASE_PORT + 300,
        accounting=False,
        extra_nodes=EXTRA,
    )
    cl.up(timeout=60)
    yield cl
    cl.down()


@pytest.fixture()
def client(big: DevCluster) -> tuple[SlurmClient, CountingRunner]:
    runner = CountingRunner.like(big.client().runner)
    c = SlurmClient(runner)
    assert c.version
    runner.calls.clear()
    return c, runner


def test_named_nodes_among_ten_thousand(big: DevCluster, client: tuple[SlurmClient, CountingRunner]) -> None:
    """Two nodes of a 10,004-node table: the same records as the full table, read in one query of a few KB."""
    c, runner = client
    last = f"gpu-st-p5-{EXTRA}"
    nodes = c.nodes(["n2", last])
    assert runner.bytes_read < 16_000 and len(runner.calls) == 1
    full = {n.name: n for n in c.nodes() if n.name in ("n2", last)}
    assert nodes == [full["n2"], full[last]]
    assert nodes[1].has("POWERED_DOWN", "CLOUD") and nodes[1].gres == "gpu:8" and nodes[1].partitions == ("p5",)
    with pytest.raises(SlurmError, match="unknown node"):
        c.nodes([f"gpu-st-p5-{EXTRA + 1}"])


def test_reason_listing_count_and_idle_nodes_at_scale(
    big: DevCluster, client: tuple[SlurmClient, CountingRunner]
) -> None:
    c, runner = client
    c.set_node_state(["gpu-st-p5-77"], "drain", "Action:Reboot ecc")
    c.set_node_state(["n3"], "fail", "Action:Replace xid=79")
    runner.calls.clear()
    out = c.nodes_out_of_service()
    assert [n.name for n in out] == ["gpu-st-p5-77", "n3"] and out[1].reason == "Action:Replace xid=79"
    assert c.node_count() == EXTRA + 4
    assert c.idle_nodes("debug") == ["n1", "n2", "n4"]
    assert runner.bytes_read < 16_000


def test_job_read_names_the_job(big: DevCluster, client: tuple[SlurmClient, CountingRunner]) -> None:
    c, runner = client
    job = c.sbatch("-N2", "-p", "debug", "-w", "n1,n2", "-o", "/dev/null", "--wrap", "sleep 30")
    deadline = time.monotonic() + 30
    while not c.job(job).is_running and time.monotonic() < deadline:
        time.sleep(0.2)
    j = c.job(job)
    assert j.nodes == ("n1", "n2") and j.partition == "debug"
    assert all(cmd.startswith(("sbatch", job_read(big, job))) for cmd in runner.commands())
    c.cancel(job)
