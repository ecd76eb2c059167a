"""What a controller poll asks slurmctld, counted through the command runner on the real devcluster:
only the nodes out of service (each carries a reason) and, by name, the nodes under repair."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.controller.loop import Controller
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.runner import CountingRunner
from hpresilience.testing.devcluster import DevCluster
from tests.conftest import node_read
from tests.controller.conftest import Scripts, settings_for

pytestmark = pytest.mark.integration
LIST_OUT_OF_SERVICE = "sinfo -h -N -R -o %N"


def counting_client(cl: DevCluster) -> tuple[SlurmClient, CountingRunner]:
    runner = CountingRunner.like(cl.client().runner)
    client = SlurmClient(runner)
    assert client.version
    runner.calls.clear()
    return client, runner


def test_poll_reads_only_nodes_with_a_reason(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path
) -> None:
    """All in service: one short listing. An operator's drain (never repaired) and a replace request: the
    listing, then those two nodes by name; the nodes in service are never read."""
    client, runner = counting_client(cluster)
    ctl = Controller(settings_for(scripts, tmp_path / "state", dry_run=True), client)
    ctl.cycle()
    assert runner.commands() == [LIST_OUT_OF_SERVICE]
    slurm.set_node_state(["n3"], "drain", "operator: bad fan")
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    runner.calls.clear()
    ctl.cycle()
    assert runner.commands() == [LIST_OUT_OF_SERVICE, node_read(cluster, "n[2-3]")]
    assert list(ctl.records) == ["n2"]


def test_node_under_repair_is_read_by_name_once_back_in_service(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path
) -> None:
    """A repair in progress needs its node also after it left the out-of-service list: it is read by name,
    and a node that is back in service outside the controller ends its record."""
    client, runner = counting_client(cluster)
    ctl = Controller(settings_for(scripts, tmp_path / "state", dry_run=True), client)
    slurm.set_node_state(["n4"], "fail", "Action:Reboot")
    ctl.cycle()
    assert list(ctl.records) == ["n4"]
    slurm.set_node_state(["n4"], "resume")
    runner.calls.clear()
    ctl.cycle()
    assert runner.commands() == [LIST_OUT_OF_SERVICE, node_read(cluster, "n4")]
    assert ctl.records == {}
