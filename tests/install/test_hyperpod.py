"""--role auto: the role from HyperPod's resource_config.json (this host's IP -> instance group) and the
lifecycle scripts' provisioning_parameters.json (which group is the controller, which the login)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpresilience.errors import ConfigError
from hpresilience.install.hyperpod import detect_role, local_addresses
from tests.install.conftest import hpr_install


def resource_config(tmp_path: Path) -> Path:
    rc = {
        "ClusterConfig": {
            "ClusterArn": "arn:aws:sagemaker:us-west-2:111122223333:cluster/abc",
            "ClusterName": "ml-cluster",
        },
        "InstanceGroups": [
            {
                "Name": "controller-machine",
                "InstanceType": "ml.m5.12xlarge",
                "Instances": [
                    {
                        "InstanceName": "controller-machine-1",
                        "CustomerIpAddress": "10.1.0.10",
                        "AgentIpAddress": "172.16.0.10",
                    }
                ],
            },
            {
                "Name": "login-group",
                "InstanceType": "ml.m5.4xlarge",
                "Instances": [{"InstanceName": "login-group-1", "CustomerIpAddress": "10.1.0.20"}],
            },
            {
                "Name": "worker-group-1",
                "InstanceType": "ml.p5.48xlarge",
                "Instances": [
                    {"InstanceName": "worker-group-1-1", "CustomerIpAddress": "10.1.1.5"},
                    {"InstanceName": "worker-group-1-2", "CustomerIpAddress": "10.1.1.6"},
                ],
            },
        ],
    }
    p = tmp_path / "resource_config.json"
    p.write_text(json.dumps(rc))
    return p


def provisioning(tmp_path: Path) -> Path:
    p = tmp_path / "provisioning_parameters.json"
    p.write_text(
        json.dumps(
            {
                "version": "1.0.0",
                "workload_manager": "slurm",
                "controller_group": "controller-machine",
                "login_group": "login-group",
                "worker_groups": [{"instance_group_name": "worker-group-1", "partition_name": "dev"}],
            }
        )
    )
    return p


@pytest.mark.parametrize(
    ("ip", "role", "group"),
    [
        ("10.1.0.10", "controller", "controller-machine"),
        ("10.1.0.20", "login", "login-group"),
        ("10.1.1.6", "compute", "worker-group-1"),
    ],
)
def test_role_from_the_groups_named_in_provisioning_parameters(tmp_path: Path, ip: str, role: str, group: str) -> None:
    assert detect_role(resource_config(tmp_path), provisioning(tmp_path), {ip, "127.0.0.1"}) == (role, group)


def test_without_provisioning_parameters_the_group_name_tells(tmp_path: Path) -> None:
    assert detect_role(resource_config(tmp_path), tmp_path / "absent.json", {"10.1.0.10"})[0] == "controller"
    assert detect_role(resource_config(tmp_path), None, {"10.1.1.5"})[0] == "compute"


def test_a_host_in_no_group_is_an_error_naming_the_file(tmp_path: Path) -> None:
    rc = resource_config(tmp_path)
    with pytest.raises(ConfigError, match=f"{rc}: none of this host's addresses"):
        detect_role(rc, None, {"192.168.9.9"})


def test_local_addresses_include_loopback() -> None:
    assert "127.0.0.1" in local_addresses()


def test_role_auto_reads_this_hosts_own_addresses(tmp_path: Path) -> None:
    """End to end through the CLI: 127.0.0.1 is a login instance here; the role is printed, then the missing
    source stops the install (nothing is built in this test)."""
    rc = resource_config(tmp_path)
    data = json.loads(rc.read_text())
    data["InstanceGroups"][1]["Instances"][0]["CustomerIpAddress"] = "127.0.0.1"
    rc.write_text(json.dumps(data))
    res = hpr_install(
        "--role",
        "auto",
        "--resource-config",
        str(rc),
        "--provisioning-parameters",
        str(provisioning(tmp_path)),
        "--root",
        str(tmp_path / "r"),
    )
    assert "role login (instance group 'login-group'" in res.stdout
    assert res.returncode == 2 and "give --wheel FILE" in res.stderr
