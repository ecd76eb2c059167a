"""`ec2`: reboot the node's instance, or terminate it and launch a replacement from the group's launch template.

The instance behind a Slurm node is found by a tag (`tag_key` = the Slurm node name; replacements get the
same tag, so the name carries over) or by its private DNS name / IP (the node's NodeHostname / NodeAddr).
After a replacement runs, Slurm is pointed at its new private address (same node name) when
`update_node_address` is on; the instance's own start-up (user data) starts `slurmd -N <name>`.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import Field, model_validator

from hpresilience.controller.providers import ProviderContext
from hpresilience.controller.providers.aws import aws_client, error_text
from hpresilience.errors import ExternalError
from hpresilience.log import get_logger
from hpresilience.reasons import Action
from hpresilience.settings_base import Section
from hpresilience.slurm.models import Node

log = get_logger("hpresilience.controller")
LIVE_STATES = ["pending", "running", "stopping", "stopped"]


class Ec2Options(Section):
    region: str = ""
    endpoint_url: str = ""
    lookup: Literal["tag", "private_dns", "private_ip"] = "tag"
    tag_key: str = "hpresilience:slurm-node"
    launch_template_id: str = ""
    launch_template_name: str = ""
    launch_template_version: str = "$Default"
    # Extra tags for replacements (the node-name tag is always set).
    tags: dict[str, str] = Field(default_factory=dict)
    update_node_address: bool = True
    wait_running_s: float = Field(default=600.0, gt=0)
    poll_s: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _one_template(self) -> Ec2Options:
        if self.launch_template_id and self.launch_template_name:
            raise ValueError("set launch_template_id or launch_template_name, not both")
        return self


class Ec2Provider:
    name = "ec2"
    Options: ClassVar[type[Ec2Options]] = Ec2Options

    def __init__(self, options: Ec2Options, context: ProviderContext, ec2: Any = None) -> None:
        self.options = options
        self.slurm = context.client
        self.ec2 = ec2 if ec2 is not None else aws_client("ec2", options.region, options.endpoint_url)

    def find_instance(self, node: Node) -> dict[str, Any]:
        o = self.options
        filters = [{"Name": "instance-state-name", "Values": LIVE_STATES}]
        if o.lookup == "tag":
            filters.append({"Name": f"tag:{o.tag_key}", "Values": [node.name]})
        elif o.lookup == "private_dns":
            host = node.hostname or node.name
            region = self.ec2.meta.region_name
            # Exact names (EC2's two private DNS forms) rather than a wildcard: every EC2 API look-alike has these.
            filters.append(
                {
                    "Name": "private-dns-name",
                    "Values": [host, f"{host}.ec2.internal", f"{host}.{region}.compute.internal"],
                }
            )
        else:
            filters.append({"Name": "private-ip-address", "Values": [node.address]})
        found = [
            i
            for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
            for r in page["Reservations"]
            for i in r["Instances"]
        ]
        if len(found) != 1:
            ids = ", ".join(i["InstanceId"] for i in found) or "none"
            raise ExternalError(f"node {node.name}: expected one EC2 instance by {o.lookup}, found {ids}")
        return dict(found[0])

    def act(self, node: Node, action: Action) -> str:
        try:
            inst = self.find_instance(node)
            if action is Action.REBOOT:
                self.ec2.reboot_instances(InstanceIds=[inst["InstanceId"]])
                return f"rebooted instance {inst['InstanceId']}"
            return self._replace(node, inst)
        except ExternalError:
            raise
        except (BotoCoreError, ClientError) as err:  # keep Code and Message only, never the request
            raise ExternalError(f"ec2 {action} of {node.name}: {error_text(err)}") from None

    def _replace(self, node: Node, old: dict[str, Any]) -> str:
        o = self.options
        template: dict[str, str] = {"Version": o.launch_template_version}
        if o.launch_template_id:
            template["LaunchTemplateId"] = o.launch_template_id
        elif o.launch_template_name:
            template["LaunchTemplateName"] = o.launch_template_name
        else:
            raise ExternalError(f"node {node.name}: the ec2 provider needs launch_template_id or _name to replace")
        old_id = old["InstanceId"]
        # Terminate first: a GPU capacity reservation usually has no room for old and new side by side.
        self.ec2.terminate_instances(InstanceIds=[old_id])
        tags = [{"Key": k, "Value": v} for k, v in {**o.tags, o.tag_key: node.name}.items()]
        kwargs: dict[str, Any] = {
            "LaunchTemplate": template,
            "MinCount": 1,
            "MaxCount": 1,
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        }
        subnet = old.get("SubnetId")
        if subnet:
            kwargs["SubnetId"] = subnet
        new = self.ec2.run_instances(**kwargs)["Instances"][0]
        new_id = new["InstanceId"]
        log.info("ec2_instance_replaced", node=node.name, old=old_id, new=new_id)
        if o.update_node_address:
            ip, dns = self._wait_address(new_id)
            self.slurm.set_node_address(node.name, ip, dns.split(".")[0] if o.lookup == "private_dns" else "")
        return f"terminated {old_id}, launched {new_id}"

    def _wait_address(self, instance_id: str) -> tuple[str, str]:
        deadline = time.monotonic() + self.options.wait_running_s
        while True:
            res = self.ec2.describe_instances(InstanceIds=[instance_id])
            inst = res["Reservations"][0]["Instances"][0]
            ip = inst.get("PrivateIpAddress", "")
            if inst.get("State", {}).get("Name") == "running" and ip:
                return str(ip), str(inst.get("PrivateDnsName", ""))
            if time.monotonic() > deadline:
                raise ExternalError(
                    f"instance {instance_id} not running with an address after {self.options.wait_running_s:g} s"
                )
            time.sleep(self.options.poll_s)
