"""The `hyperpod` provider through botocore's Stubber, which checks each request and response against the
installed SageMaker service model (BatchRebootClusterNodes, BatchReplaceClusterNodes, ListClusterNodes)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from hpresilience.controller.providers import ProviderContext, create_provider
from hpresilience.controller.providers.hyperpod import HyperPodOptions, HyperPodProvider
from hpresilience.errors import ConfigError, ExternalError
from hpresilience.reasons import Action
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node

CLUSTER = "ml-cluster"


@pytest.fixture()
def sm() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client(
        "sagemaker", region_name="us-west-2", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def summary(instance_id: str, host: str) -> dict[str, Any]:
    return {
        "InstanceGroupName": "gpu",
        "InstanceId": instance_id,
        "InstanceType": "ml.p5.48xlarge",
        "LaunchTime": datetime(2025, 1, 1, tzinfo=timezone.utc),
        "InstanceStatus": {"Status": "Running"},
        "PrivateDnsHostname": f"{host}.us-west-2.compute.internal",
    }


def node(name: str) -> Node:
    return Node(name=name, address="10.1.2.3", hostname=name, states=frozenset({"IDLE", "DRAIN"}))


def test_replace_looks_up_node_id_across_pages_and_calls_batch_replace(sm: tuple[Any, Stubber]) -> None:
    client, stub = sm
    stub.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [summary("i-0123456789abcdef0", "ip-10-1-2-4")], "NextToken": "page2"},
        {"ClusterName": CLUSTER},
    )
    stub.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [summary("i-0aaaaaaaaaaaaaaaa", "ip-10-1-2-3")]},
        {"ClusterName": CLUSTER, "NextToken": "page2"},
    )
    stub.add_response(
        "batch_replace_cluster_nodes",
        {"Successful": ["i-0aaaaaaaaaaaaaaaa"]},
        {"ClusterName": CLUSTER, "NodeIds": ["i-0aaaaaaaaaaaaaaaa"]},
    )
    p = HyperPodProvider(HyperPodOptions(cluster_name=CLUSTER), sagemaker=client)
    assert p.act(node("ip-10-1-2-3"), Action.REPLACE) == "hyperpod replace of i-0aaaaaaaaaaaaaaaa accepted"


def test_reboot_with_explicit_node_id_calls_batch_reboot(sm: tuple[Any, Stubber]) -> None:
    client, stub = sm
    stub.add_response(
        "batch_reboot_cluster_nodes",
        {"Successful": ["i-0bbbbbbbbbbbbbbbb"]},
        {"ClusterName": CLUSTER, "NodeIds": ["i-0bbbbbbbbbbbbbbbb"]},
    )
    options = HyperPodOptions(cluster_name=CLUSTER, node_ids={"gpu-1": "i-0bbbbbbbbbbbbbbbb"})
    p = HyperPodProvider(options, sagemaker=client)
    assert p.act(node("gpu-1"), Action.REBOOT) == "hyperpod reboot of i-0bbbbbbbbbbbbbbbb accepted"


def test_refused_node_is_an_external_error_with_hyperpods_code(sm: tuple[Any, Stubber]) -> None:
    client, stub = sm
    stub.add_response(
        "batch_reboot_cluster_nodes",
        {
            "Failed": [
                {
                    "NodeId": "i-0bbbbbbbbbbbbbbbb",
                    "ErrorCode": "InvalidNodeStatus",
                    "Message": "node is already being replaced",
                }
            ]
        },
        {"ClusterName": CLUSTER, "NodeIds": ["i-0bbbbbbbbbbbbbbbb"]},
    )
    options = HyperPodOptions(cluster_name=CLUSTER, node_ids={"gpu-1": "i-0bbbbbbbbbbbbbbbb"})
    p = HyperPodProvider(options, sagemaker=client)
    with pytest.raises(ExternalError, match="refused: InvalidNodeStatus: node is already being replaced"):
        p.act(node("gpu-1"), Action.REBOOT)


def test_api_error_and_unknown_node_are_clear_errors(sm: tuple[Any, Stubber]) -> None:
    client, stub = sm
    stub.add_client_error(
        "list_cluster_nodes",
        "ResourceNotFound",
        "Cluster ml-cluster not found",
        expected_params={"ClusterName": CLUSTER},
    )
    stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": []}, {"ClusterName": CLUSTER})
    p = HyperPodProvider(HyperPodOptions(cluster_name=CLUSTER), sagemaker=client)
    with pytest.raises(ExternalError, match="hyperpod replace of gpu-9: ResourceNotFound: Cluster ml-cluster"):
        p.act(node("gpu-9"), Action.REPLACE)
    with pytest.raises(ExternalError, match=r"no HyperPod node .* \(set node_ids"):
        p.act(node("gpu-9"), Action.REPLACE)


def test_cluster_name_is_required() -> None:
    with pytest.raises(ConfigError, match="provider 'hyperpod': cluster_name"):
        create_provider("hyperpod", {}, ProviderContext(SlurmClient(), "hp"))
