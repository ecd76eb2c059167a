"""`hyperpod`: SageMaker HyperPod's BatchRebootClusterNodes / BatchReplaceClusterNodes, for clusters that run
on HyperPod but use our checks and auto-resume.

The HyperPod node id (`i-...`) of a Slurm node is found with ListClusterNodes: HyperPod names Slurm nodes
after the instance's private DNS host name (`ip-10-1-2-3`), or `node_ids` maps names to ids explicitly.
"""

from __future__ import annotations

from typing import Any, ClassVar

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import Field

from hpresilience.controller.providers import ProviderContext
from hpresilience.controller.providers.aws import aws_client, error_text
from hpresilience.errors import ExternalError
from hpresilience.reasons import Action
from hpresilience.settings_base import Section
from hpresilience.slurm.models import Node


class HyperPodOptions(Section):
    cluster_name: str = Field(min_length=1)  # name or ARN
    region: str = ""
    endpoint_url: str = ""
    node_ids: dict[str, str] = Field(default_factory=dict)
    instance_group: str = ""  # narrows ListClusterNodes on big clusters


class HyperPodProvider:
    name = "hyperpod"
    Options: ClassVar[type[HyperPodOptions]] = HyperPodOptions

    def __init__(self, options: HyperPodOptions, context: ProviderContext | None = None, sagemaker: Any = None) -> None:
        self.options = options
        self.sm = sagemaker if sagemaker is not None else aws_client("sagemaker", options.region, options.endpoint_url)

    def node_id(self, node: Node) -> str:
        if node.name in self.options.node_ids:
            return self.options.node_ids[node.name]
        names = {node.name, node.hostname.split(".")[0]} - {""}
        kwargs: dict[str, Any] = {"ClusterName": self.options.cluster_name}
        if self.options.instance_group:
            kwargs["InstanceGroupNameContains"] = self.options.instance_group
        while True:
            page = self.sm.list_cluster_nodes(**kwargs)
            for s in page.get("ClusterNodeSummaries", []):
                if s.get("PrivateDnsHostname", "").split(".")[0] in names:
                    return str(s["InstanceId"])
            token = page.get("NextToken")
            if not token:
                raise ExternalError(
                    f"node {node.name}: no HyperPod node of cluster {self.options.cluster_name} "
                    "has that private DNS host name (set node_ids to map it)"
                )
            kwargs["NextToken"] = token

    def act(self, node: Node, action: Action) -> str:
        try:
            node_id = self.node_id(node)
            batch = (
                self.sm.batch_reboot_cluster_nodes if action is Action.REBOOT else self.sm.batch_replace_cluster_nodes
            )
            res = batch(ClusterName=self.options.cluster_name, NodeIds=[node_id])
        except ExternalError:
            raise
        except (BotoCoreError, ClientError) as err:  # keep Code and Message only, never the request
            raise ExternalError(f"hyperpod {action} of {node.name}: {error_text(err)}") from None
        for f in res.get("Failed", []):
            raise ExternalError(
                f"hyperpod {action} of {node.name} ({f.get('NodeId')}) refused: "
                f"{f.get('ErrorCode')}: {f.get('Message')}"
            )
        if node_id not in res.get("Successful", []):
            raise ExternalError(f"hyperpod {action} of {node.name}: {node_id} not in the successful list")
        return f"hyperpod {action} of {node_id} accepted"
