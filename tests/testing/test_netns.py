"""netns.py's names and checks that need no namespace (the namespaces themselves: test_netns_integration.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.errors import ConfigError
from hpresilience.testing import netns
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.netns import Isolation


def test_an_unknown_isolation_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown isolation 'vm'; known: none, netns"):
        Isolation.parse("vm")


def test_names_carry_the_base_port_so_two_clusters_never_share_a_namespace() -> None:
    assert netns.ctl_ns(24000) != netns.ctl_ns(24100)
    assert netns.node_ns(24000, "n1") == "hpr24000-n1" and netns.node_ns(24000, "n1").startswith(netns.prefix(24000))
    assert not netns.node_ns(240001, "n1").startswith(netns.prefix(24000))  # the dash ends the port
    assert len(netns.bridge_port("n64")) <= 15  # Linux's limit on interface names


def test_a_negative_delay_is_refused_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match="--delay-ms must be >= 0"):
        netns.slow(24000, "n1", -5)


def test_a_netns_cluster_gives_each_node_its_bridge_address_and_the_controller_its_own(tmp_path: Path) -> None:
    cl = DevCluster(f"{tmp_path}/c", nodes=2, base_port=24000, isolation=Isolation.NETNS, accounting=False)
    conf = cl.render_conf()
    assert f"SlurmctldHost=localhost({netns.CTL_ADDR})" in conf
    assert "NodeAddr=10.77.0.11 " in conf and "NodeAddr=10.77.0.12 " in conf
    assert cl.command_prefix() == ["nsenter", "--net=/run/netns/hpr24000-ctl"]


def test_a_backup_controller_needs_isolation_and_runs_without_accounting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs --isolation netns"):
        DevCluster(f"{tmp_path}/a", backup_controller=True)
    with pytest.raises(ConfigError, match="without accounting"):
        DevCluster(f"{tmp_path}/b", isolation=Isolation.NETNS, backup_controller=True, accounting=True)
    cl = DevCluster(f"{tmp_path}/c", isolation=Isolation.NETNS, backup_controller=True)
    conf = cl.render_conf()
    assert "SlurmctldHost=ctl1(10.77.0.1)" in conf and "SlurmctldHost=ctl2(10.77.0.2)" in conf
    assert not cl.accounting_wanted()
