"""The `ec2` provider against a moto server over real HTTP: finding the instance, reboot, replace."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from hpresilience.controller.providers import ProviderContext, create_provider
from hpresilience.controller.providers.ec2 import Ec2Options, Ec2Provider
from hpresilience.errors import ConfigError, ExternalError
from hpresilience.reasons import Action
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from tests.ports import free_port

AMI = "ami-12c6146b"  # one of moto's built-in images


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture()
def ec2(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("ec2", endpoint_url=moto_url, region_name="us-east-1")
    requests = __import__("urllib.request").request
    requests.urlopen(requests.Request(f"{moto_url}/moto-api/reset", method="POST")).read()
    return client


class RecordingSlurm(SlurmClient):
    """A real SlurmClient whose commands are recorded instead of run (no cluster needed for EC2 tests)."""

    def __init__(self) -> None:
        from hpresilience.slurm.runner import CommandRunner, Result

        self.calls: list[tuple[str, ...]] = []
        outer = self

        class Runner(CommandRunner):
            def run(self, tool: str, *args: str, **kwargs: Any) -> Result:
                outer.calls.append((tool, *args))
                return Result((tool, *args), 0, "", "")

        super().__init__(Runner())


def node(name: str, address: str = "10.0.0.1", hostname: str = "") -> Node:
    return Node(name=name, address=address, hostname=hostname or name, states=frozenset({"IDLE", "DRAIN"}))


def launch(ec2: Any, name: str, tag_key: str = "hpresilience:slurm-node") -> dict[str, Any]:
    res = ec2.run_instances(
        ImageId=AMI,
        MinCount=1,
        MaxCount=1,
        InstanceType="p5.48xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": tag_key, "Value": name}]}],
    )
    return dict(res["Instances"][0])


def provider(moto_url: str, slurm: SlurmClient, **options: Any) -> Ec2Provider:
    p = create_provider(
        "ec2",
        {"endpoint_url": moto_url, "region": "us-east-1", "poll_s": 0.1, **options},
        ProviderContext(slurm, "gpu"),
    )
    assert isinstance(p, Ec2Provider)
    return p


def test_reboot_finds_the_instance_by_tag_and_reboots_it(ec2: Any, moto_url: str) -> None:
    launch(ec2, "gpu-1")
    target = launch(ec2, "gpu-2")
    p = provider(moto_url, RecordingSlurm())
    assert p.find_instance(node("gpu-2"))["InstanceId"] == target["InstanceId"]
    assert p.act(node("gpu-2"), Action.REBOOT) == f"rebooted instance {target['InstanceId']}"
    state = ec2.describe_instances(InstanceIds=[target["InstanceId"]])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] == "running"


def test_replace_terminates_launches_from_template_with_same_name_and_repoints_slurm(ec2: Any, moto_url: str) -> None:
    lt = ec2.create_launch_template(
        LaunchTemplateName="gpu-nodes", LaunchTemplateData={"ImageId": AMI, "InstanceType": "p5.48xlarge"}
    )
    old = launch(ec2, "gpu-7")
    slurm = RecordingSlurm()
    p = provider(moto_url, slurm, launch_template_id=lt["LaunchTemplate"]["LaunchTemplateId"], tags={"team": "ml"})
    detail = p.act(node("gpu-7", address=old["PrivateIpAddress"]), Action.REPLACE)

    old_state = ec2.describe_instances(InstanceIds=[old["InstanceId"]])["Reservations"][0]["Instances"][0]
    assert old_state["State"]["Name"] == "terminated"
    new = p.find_instance(node("gpu-7"))
    assert (
        new["InstanceId"] != old["InstanceId"]
        and detail == f"terminated {old['InstanceId']}, launched {new['InstanceId']}"
    )
    tags = {t["Key"]: t["Value"] for t in new["Tags"]}
    lt_id = lt["LaunchTemplate"]["LaunchTemplateId"]
    assert tags == {
        "hpresilience:slurm-node": "gpu-7",
        "team": "ml",
        "aws:ec2launchtemplate:id": lt_id,
        "aws:ec2launchtemplate:version": "1",
    }
    assert new["ImageId"] == AMI and new["InstanceType"] == "p5.48xlarge"
    assert slurm.calls == [("scontrol", "update", "nodename=gpu-7", f"nodeaddr={new['PrivateIpAddress']}")]


def test_lookup_by_private_ip_and_private_dns(ec2: Any, moto_url: str) -> None:
    inst = launch(ec2, "x")
    by_ip = provider(moto_url, RecordingSlurm(), lookup="private_ip")
    assert by_ip.find_instance(node("n", address=inst["PrivateIpAddress"]))["InstanceId"] == inst["InstanceId"]
    by_dns = provider(moto_url, RecordingSlurm(), lookup="private_dns")
    host = inst["PrivateDnsName"].split(".")[0]
    assert by_dns.find_instance(node("n", hostname=host))["InstanceId"] == inst["InstanceId"]


def test_no_instance_or_aws_error_is_one_clear_external_error(ec2: Any, moto_url: str) -> None:
    p = provider(moto_url, RecordingSlurm(), launch_template_name="does-not-exist")
    with pytest.raises(ExternalError, match="expected one EC2 instance by tag, found none"):
        p.act(node("ghost"), Action.REBOOT)
    launch(ec2, "gpu-9")
    with pytest.raises(ExternalError, match=r"ec2 replace of gpu-9: .*(LaunchTemplate|launch template)") as err:
        p.act(node("gpu-9"), Action.REPLACE)
    assert "testing" not in str(err.value)  # no credential, no request in the message


def test_bad_options_are_config_errors_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"group 'gpu', provider 'ec2': lookup"):
        create_provider("ec2", {"lookup": "magic"}, ProviderContext(RecordingSlurm(), "gpu"))
    with pytest.raises(ConfigError, match="launch_tmplate_id: unknown key"):
        create_provider("ec2", {"launch_tmplate_id": "lt-1"}, ProviderContext(RecordingSlurm(), "gpu"))
    with pytest.raises(ValueError, match="not both"):
        Ec2Options(launch_template_id="lt-1", launch_template_name="x")
