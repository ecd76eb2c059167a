"""hpr_cluster_nodes says what it counts: the nodes out of service (and under repair), not every node."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hpresilience.controller.loop import Controller
from hpresilience.controller.settings import ControllerSettings
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster

pytestmark = pytest.mark.integration


def test_cluster_nodes_counts_the_nodes_out_of_service_as_its_help_text_says(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """4 nodes, one drained by an operator: the gauge sums to 1 (by state drain, owner operator), and its help
    text says it counts nodes out of service and not those in service."""
    slurm.set_node_state(["n3"], "drain", "fan replaced, burn-in")
    registry = CollectorRegistry()
    ctl = Controller(ControllerSettings(state_dir=str(tmp_path), metrics_address=""), slurm, registry=registry)
    ctl.cycle()
    [family] = [f for f in registry.collect() if f.name == "hpr_cluster_nodes"]
    assert [(s.labels, s.value) for s in family.samples] == [({"state": "drain", "owner": "operator"}, 1.0)]
    assert family.documentation.startswith("Nodes out of service in Slurm")
    assert "nodes in service are not counted" in family.documentation
