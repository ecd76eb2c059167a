"""isolation.py: the devcluster's isolation modes behind one protocol, chosen from one table (the namespaces
themselves: test_netns_integration.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpresilience.errors import ConfigError
from hpresilience.testing import devconf, isolation
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.isolation import Cluster, HostIsolation, NetnsIsolation
from hpresilience.testing.netns import Isolation
from hpresilience.testing.slurmroot import SlurmRelease


class ToyIsolation(HostIsolation):
    """A mode of its own: its nodes on 127.0.5.x, its controller on 127.0.5.1, its commands under `toyenter`."""

    def node_address(self, index: int) -> str:
        return f"127.0.5.{100 + index}"

    def controller_hosts(self) -> list[str]:
        return ["toyctl(127.0.5.1)"]

    def command_prefix(self) -> list[str]:
        return ["toyenter"]


def test_a_new_mode_is_one_class_and_one_table_row_and_the_cluster_asks_it_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(isolation.MODES, Isolation.NONE, ToyIsolation)
    cl = DevCluster(tmp_path / "c", nodes=2, base_port=24000, accounting=False)
    conf = cl.render_conf()
    assert "SlurmctldHost=toyctl(127.0.5.1)" in conf
    assert "NodeAddr=127.0.5.101 " in conf and "NodeAddr=127.0.5.102 " in conf
    assert cl.command_prefix() == ["toyenter"]
    assert isinstance(cl.mode, ToyIsolation)


def test_host_isolation_gives_loopback_addresses_and_refuses_link_faults_naming_netns(tmp_path: Path) -> None:
    cl = DevCluster(tmp_path / "c", nodes=2, base_port=24000, accounting=False)
    assert isinstance(cl.mode, HostIsolation) and not cl.netns
    conf = cl.render_conf()
    assert "SlurmctldHost=localhost(127.0.0.1)" in conf and "NodeAddr=127.0.0.12 " in conf
    assert cl.command_prefix() == [] and cl.kill_primary_controller() is None
    for op, args in (("partition", ("n1",)), ("heal", ("nope",)), ("slow", ("n1", 5))):
        with pytest.raises(ConfigError, match=r"shares the host's network .*--isolation netns"):
            getattr(cl, op)(*args)


def test_netns_isolation_checks_the_node_name_before_touching_any_namespace(tmp_path: Path) -> None:
    cl = DevCluster(tmp_path / "c", nodes=2, base_port=24000, isolation=Isolation.NETNS, accounting=False)
    assert isinstance(cl.mode, NetnsIsolation) and cl.netns
    with pytest.raises(ConfigError, match="unknown node 'n9'; known: n1, n2"):
        cl.partition("n9")
    with pytest.raises(ConfigError, match="unknown node 'n9'"):
        cl.slow("n9", 5)


def test_netns_isolation_takes_every_release_and_refuses_a_backup_with_accounting(tmp_path: Path) -> None:
    def cluster(release: SlurmRelease, backup: bool, accounting: bool | None) -> Cluster:
        return Cluster(tmp_path, 24000, ["n1"], release, accounting, backup, lambda *a, **k: None, lambda: "")

    for release in SlurmRelease:  # a newer release's daemons run in its root, in the namespaces all the same
        assert NetnsIsolation(cluster(release, False, None)).controller_hosts() == ["localhost(10.77.0.1)"]
    with pytest.raises(ConfigError, match="without accounting"):
        NetnsIsolation(cluster(SlurmRelease.HOST, True, True))
    with pytest.raises(ConfigError, match="needs --isolation netns"):
        HostIsolation(cluster(SlurmRelease.HOST, True, None))
    hosts = NetnsIsolation(cluster(SlurmRelease.HOST, True, None)).controller_hosts()
    assert hosts == ["ctl1(10.77.0.1)", "ctl2(10.77.0.2)"]


def test_a_netns_clusters_tasks_get_the_gloo_interface_from_its_task_prolog_and_a_host_clusters_get_none(
    tmp_path: Path,
) -> None:
    """Each netns node's host name resolves to the host's loopback: gloo must be told its link (issue 36)."""
    netns_conf = DevCluster(tmp_path / "a", nodes=2, base_port=24000, isolation=Isolation.NETNS, accounting=False)
    assert f"TaskProlog={tmp_path / 'a'}/taskprolog.sh" in netns_conf.render_conf()
    assert netns_conf.mode.task_environment()["GLOO_SOCKET_IFNAME"] == "eth0"
    host = DevCluster(tmp_path / "b", nodes=2, base_port=24000, accounting=False)
    assert "TaskProlog" not in host.render_conf() and host.mode.task_environment() == {}


def test_the_task_prolog_exports_each_variable_unless_the_task_set_it_itself(tmp_path: Path) -> None:
    script = tmp_path / "prolog.sh"
    script.write_text(devconf.render_task_prolog({"GLOO_SOCKET_IFNAME": "eth0"}))
    run = subprocess.run(["sh", str(script)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert run.stdout == "export GLOO_SOCKET_IFNAME=eth0\n"
    kept = subprocess.run(
        ["sh", str(script)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "GLOO_SOCKET_IFNAME": "lo"}
    )
    assert kept.stdout == ""
    with pytest.raises(ConfigError, match="a plain name and value only"):
        devconf.render_task_prolog({"X": "a; rm -rf /"})


def test_the_clusters_environment_gives_each_rank_one_intra_op_thread_unless_the_user_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nodes share this machine's cores: an unset OMP_NUM_THREADS becomes 1 (idle OpenMP workers spin on the
    cores the other ranks need); a value the user set is kept."""
    cl = DevCluster(tmp_path / "c", nodes=2, base_port=24000, accounting=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cl.env()["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert cl.env()["OMP_NUM_THREADS"] == "6"
