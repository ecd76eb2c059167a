"""Slurm operations the replacement controller needs beyond SlurmClient's."""

from __future__ import annotations

from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient

log = get_logger("hpresilience.slurm")


def set_node_address(client: SlurmClient, name: str, address: str, hostname: str = "") -> None:
    """Point node `name` at a replacement machine: `scontrol update nodename=X nodeaddr=A [nodehostname=H]`.

    The Slurm name stays; only where slurmctld reaches it changes (an EC2 replacement has a new private IP).
    """
    args = ["update", f"nodename={name}", f"nodeaddr={address}"]
    if hostname:
        args.append(f"nodehostname={hostname}")
    client.runner.run("scontrol", *args)
    log.info("node_address_set", node=name, address=address, hostname=hostname or None)
