"""A node's role on a HyperPod-style cluster, the way HyperPod's own lifecycle scripts work it out.

HyperPod writes /opt/ml/config/resource_config.json on every node: its instance groups and each
instance's IP (`InstanceGroups[].Instances[].CustomerIpAddress`). The lifecycle scripts'
provisioning_parameters.json names the controller and login groups (`controller_group`, `login_group`);
every other group is compute. Without that file, a group whose name says controller/head or login is
taken for one.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import psutil

from hpresilience.errors import ConfigError
from hpresilience.install.layout import Role

RESOURCE_CONFIG = "/opt/ml/config/resource_config.json"


def local_addresses() -> set[str]:
    """This host's IPv4 and IPv6 addresses, from the interfaces (no packet sent)."""
    out: set[str] = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                out.add(a.address.split("%", 1)[0])
    return out


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot read {what}: {err.strerror or err}") from None
    except ValueError as err:
        raise ConfigError(f"{path}: {what} is not valid JSON: {err}") from None


def group_of(resource_config: Any, addresses: set[str], source: str) -> str:
    """The instance group holding one of `addresses`; ConfigError when none does."""
    groups = resource_config.get("InstanceGroups") if isinstance(resource_config, dict) else None
    if not isinstance(groups, list):
        raise ConfigError(f"{source}: no InstanceGroups list")
    for g in groups:
        if not isinstance(g, dict):
            continue
        for inst in g.get("Instances") or []:
            if isinstance(inst, dict) and {inst.get("CustomerIpAddress"), inst.get("AgentIpAddress")} & addresses:
                return str(g.get("Name") or g.get("InstanceGroupName") or "")
    raise ConfigError(
        f"{source}: none of this host's addresses ({', '.join(sorted(addresses)) or 'none'}) "
        "is an instance of an InstanceGroup; pass --role"
    )


def role_of_group(group: str, provisioning: Any) -> Role:
    if isinstance(provisioning, dict):
        if group == provisioning.get("controller_group"):
            return "controller"
        if group == provisioning.get("login_group"):
            return "login"
        return "compute"
    name = group.lower()
    if "controller" in name or "head" in name:
        return "controller"
    if "login" in name:
        return "login"
    return "compute"


def detect_role(
    resource_config: Path, provisioning: Path | None = None, addresses: set[str] | None = None
) -> tuple[Role, str]:
    """(role, instance group) of this host; ConfigError naming the file when it cannot be told."""
    rc = _read_json(resource_config, "the HyperPod resource config")
    group = group_of(rc, local_addresses() if addresses is None else addresses, str(resource_config))
    pp = _read_json(provisioning, "provisioning parameters") if provisioning and provisioning.exists() else None
    return role_of_group(group, pp), group
