"""How a devcluster's nodes are separated: one class per isolation mode behind one protocol.

    none    HostIsolation: every daemon shares the host's network and process table; each node has its own
            loopback address (127.0.0.11, ...: every 127.x address is local on Linux) and port.
    netns   NetnsIsolation: each node is a host of its own, a network and PID namespace on a private bridge
            (netns.py, nsinit.py); the controller (and a backup controller) has namespaces of its own, and
            links can be cut, healed and slowed.

DevCluster (devcluster.py) holds one mode and calls it wherever the two differ: addresses, the controller's host
lines, where commands run, how a node's slurmd starts and is found, link faults and teardown. It never asks which
mode it holds; adding a mode is one class here and one row in MODES.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from hpresilience.errors import ConfigError
from hpresilience.log import get_logger
from hpresilience.slurm.runner import CommandRunner
from hpresilience.testing import devaccounting, netns, netshape, nodecpu
from hpresilience.testing.devprocs import MARKER, DevclusterError, pidfile_pid, port_listening
from hpresilience.testing.netns import Isolation
from hpresilience.testing.slurmroot import SlurmRelease

log = get_logger("hpresilience.devcluster")

NSINIT = Path(__file__).with_name("nsinit.py")


class Spawn(Protocol):
    """Starts a daemon with the cluster's marker: `where` is the argv prefix placing it (None: where the cluster's
    commands run), `foreground` detaches a process that stays in front, logging to log/<log_name>.out."""

    def __call__(
        self, argv: list[str], foreground: bool = False, where: list[str] | None = None, log_name: str | None = None
    ) -> None: ...


@dataclass(frozen=True)
class Cluster:
    """What a mode knows of its cluster, fixed when the cluster is made."""

    state_dir: Path
    base_port: int
    names: list[str]
    release: SlurmRelease
    accounting: bool | None  # as asked for: None is "where installed"
    backup_controller: bool
    spawn: Spawn
    log_tail: Callable[[], str]


class IsolationMode(Protocol):
    """Everything DevCluster does differently by how its nodes are separated."""

    isolation: Isolation

    def node_address(self, index: int) -> str:
        """1-based node index -> the address slurmctld reaches the node's slurmd at."""

    def controller_hosts(self) -> list[str]:
        """The SlurmctldHost values, primary first."""

    def command_prefix(self) -> list[str]:
        """argv prefix that puts a command where the cluster's controller is reachable."""

    def command_runner(
        self, bin_dir: str, timeout: float, retries: int, backoff: float, env: Mapping[str, str]
    ) -> CommandRunner:
        """The runner of the cluster's client: Slurm's commands, run where command_prefix puts them."""

    def listening(self, port: int) -> bool:
        """Whether a TCP port listens on 127.0.0.1 where the controller side's daemons run (MariaDB, slurmdbd)."""

    def create(self) -> None:
        """Make the network the daemons are about to start in."""

    def start_controllers(self, slurmctld: str, conf: Path) -> None:
        """Start slurmctld (and a backup, where the mode has one) from the written slurm.conf."""

    def start_node(self, name: str, slurmd: str, conf: Path, timeout: float, extra: Sequence[str] = ()) -> None:
        """Start the node's slurmd (`extra`: more of its arguments); raises DevclusterError when it is not found
        running within timeout."""

    def node_pids(self) -> dict[str, int]:
        """node name -> host pid of its live slurmd."""

    def node_listening(self, name: str, port: int) -> bool:
        """Whether the node's port still listens (a slurmstepd may hold slurmd's socket after slurmd died)."""

    def partition(self, name: str) -> None:
        """Cut the node's link, its processes left running (ConfigError where the mode has no links)."""

    def heal(self, name: str) -> None: ...

    def slow(self, name: str, delay_ms: int) -> None:
        """Delay the node's link by delay_ms each way; 0 removes the delay."""

    def limit_rate(self, name: str, bps: int) -> None:
        """Cap the node's link at bps bits per second each way; 0 removes the cap."""

    def kill_controller(self) -> int | None:
        """SIGKILL the primary slurmctld (a crashed head node); its pid, or None when there was none to kill."""

    def teardown(self) -> None:
        """Remove what create made, also after a crash (the cluster's processes are stopped already)."""

    def task_environment(self) -> dict[str, str]:
        """Variables every task on the nodes gets (the devcluster's TaskProlog), for what real hosts have set up."""


class HostIsolation:
    """`none`: loopback addresses on the host's own network and process table."""

    isolation = Isolation.NONE

    def __init__(self, cluster: Cluster) -> None:
        if cluster.backup_controller:
            raise ConfigError("a backup controller needs --isolation netns (a host of its own)")
        self.cluster = cluster

    def node_address(self, index: int) -> str:
        return f"127.0.0.{10 + index}"  # nodes are capped at 64 by the configuration

    def controller_hosts(self) -> list[str]:
        return ["localhost(127.0.0.1)"]

    def command_prefix(self) -> list[str]:
        return []

    def command_runner(
        self, bin_dir: str, timeout: float, retries: int, backoff: float, env: Mapping[str, str]
    ) -> CommandRunner:
        return CommandRunner(bin_dir, timeout=timeout, retries=retries, backoff=backoff, env=env)

    def listening(self, port: int) -> bool:
        return devaccounting.port_open(port)

    def create(self) -> None:
        return None

    def start_controllers(self, slurmctld: str, conf: Path) -> None:
        self.cluster.spawn([slurmctld, "-c", "-f", str(conf)])

    def start_node(self, name: str, slurmd: str, conf: Path, timeout: float, extra: Sequence[str] = ()) -> None:
        # In the node's own cpu cgroup (nodecpu.py): the nodes share one process table, not one CPU quota.
        join = nodecpu.prepare(self.cluster.base_port, name)
        self.cluster.spawn([slurmd, "-f", str(conf), "-N", name, *extra], where=join)

    def node_pids(self) -> dict[str, int]:
        c = self.cluster
        pids = {n: pidfile_pid(c.state_dir / f"slurmd-{n}.pid", str(c.state_dir)) for n in c.names}
        return {n: pid for n, pid in pids.items() if pid is not None}

    def node_listening(self, name: str, port: int) -> bool:
        return port_listening(port)

    def _no_links(self) -> ConfigError:
        return ConfigError(
            f"this cluster shares the host's network (isolation {self.isolation.value}): start it "
            "with `devcluster up --isolation netns` to cut or slow a node's link"
        )

    def partition(self, name: str) -> None:
        raise self._no_links()

    def heal(self, name: str) -> None:
        raise self._no_links()

    def slow(self, name: str, delay_ms: int) -> None:
        raise self._no_links()

    def limit_rate(self, name: str, bps: int) -> None:
        raise self._no_links()

    def kill_controller(self) -> int | None:
        return None  # the host's slurmctld is not a head node of its own: nothing to crash apart from the host

    def teardown(self) -> None:
        # Namespaces are found by their names (base port), not by the state directory: a netns cluster that
        # crashed on these ports is cleaned by whatever cluster comes down on them next.
        if shutil.which("ip"):
            netns.destroy(self.cluster.base_port)
        nodecpu.remove_all(self.cluster.base_port)

    def task_environment(self) -> dict[str, str]:
        return {}  # the host's own network: gloo finds its address as on any single machine


class NetnsIsolation:
    """`netns`: each node a host of its own (its network and PID namespace), reached from the controller's
    namespace; on any release (a newer one's daemons run in its root, which sees the host's /run/netns)."""

    isolation = Isolation.NETNS

    def __init__(self, cluster: Cluster) -> None:
        if cluster.backup_controller and cluster.accounting:
            raise ConfigError(
                "a backup controller runs without accounting for now (slurmdbd listens on 127.0.0.1 "
                "inside the primary's namespace): add --no-accounting"
            )
        self.cluster = cluster
        self.ctl = netns.ctl_ns(cluster.base_port)

    def node_address(self, index: int) -> str:
        return netns.node_addr(index)

    def controller_hosts(self) -> list[str]:
        if self.cluster.backup_controller:
            # Each slurmctld has a host name of its own: Slurm picks a daemon's role by its host name.
            return [f"{netns.PRIMARY_NAME}({netns.CTL_ADDR})", f"{netns.BACKUP_NAME}({netns.BACKUP_ADDR})"]
        return [f"localhost({netns.CTL_ADDR})"]

    def command_prefix(self) -> list[str]:
        return netns.enter(self.ctl)

    def command_runner(
        self, bin_dir: str, timeout: float, retries: int, backoff: float, env: Mapping[str, str]
    ) -> CommandRunner:
        return netns.NamespaceRunner(
            self.command_prefix(), bin_dir=bin_dir, timeout=timeout, retries=retries, backoff=backoff, env=env
        )

    def listening(self, port: int) -> bool:
        return netns.listening(self.ctl, port)

    def create(self) -> None:
        c = self.cluster
        netns.destroy(c.base_port)  # what a crashed cluster on these ports left
        netns.create(c.base_port, c.names, backup=c.backup_controller)

    def start_controllers(self, slurmctld: str, conf: Path) -> None:
        c = self.cluster
        if not c.backup_controller:
            c.spawn([slurmctld, "-c", "-f", str(conf)])
            return
        c.spawn(
            [slurmctld, "-c", "-f", str(conf)], where=[*self.command_prefix(), *netns.with_hostname(netns.PRIMARY_NAME)]
        )
        # No -c: on taking over, the backup loads the state the primary saved (the same directory). Its own
        # pid file: a slurmctld starting kills the one named in its pid file ("killing old slurmctld").
        backup_conf = c.state_dir / "slurm-backup.conf"
        backup_conf.write_text(
            conf.read_text()
            .replace(f"SlurmctldPidFile={c.state_dir}/slurmctld.pid", f"SlurmctldPidFile={c.state_dir}/backup.pid")
            .replace("log/slurmctld.log", "log/slurmctld-backup.log")
        )
        c.spawn(
            [slurmctld, "-f", str(backup_conf)],
            where=[*netns.enter(netns.backup_ns(c.base_port)), *netns.with_hostname(netns.BACKUP_NAME)],
        )

    def start_node(self, name: str, slurmd: str, conf: Path, timeout: float, extra: Sequence[str] = ()) -> None:
        """slurmd in the node's network namespace and in a PID namespace of its own with its own /proc, under
        nsinit.py as PID 1 (a PID namespace ends with its PID 1: that must not be slurmd, whose death leaves the
        steps running on a real host). The mount namespace that --mount-proc needs keeps /sys: cgroups work."""
        c = self.cluster
        nsinit = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-I", "-S", str(NSINIT)]
        c.spawn(
            [*nsinit, slurmd, "-f", str(conf), "-N", name, *extra],
            foreground=True,
            where=[*netns.enter(netns.node_ns(c.base_port, name)), *nodecpu.prepare(c.base_port, name)],
            log_name=f"nsinit-{name}",
        )
        deadline = time.monotonic() + timeout
        while name not in netns.slurmd_pids([name], MARKER, str(c.state_dir)):
            if time.monotonic() > deadline:
                raise DevclusterError(
                    f"slurmd of {name} did not start in its namespaces within {timeout:g} s\n" + c.log_tail()
                )
            time.sleep(0.05)

    def node_pids(self) -> dict[str, int]:
        # A node's pid file holds slurmd's pid inside its PID namespace: found by the marker and `-N name` instead.
        return netns.slurmd_pids(self.cluster.names, MARKER, str(self.cluster.state_dir))

    def node_listening(self, name: str, port: int) -> bool:
        return netns.listening(netns.node_ns(self.cluster.base_port, name), port)

    def _known(self, name: str) -> str:
        if name not in self.cluster.names:
            raise ConfigError(f"unknown node {name!r}; known: {', '.join(self.cluster.names)}")
        return name

    def partition(self, name: str) -> None:
        netns.partition(self.cluster.base_port, self._known(name))

    def heal(self, name: str) -> None:
        netns.heal(self.cluster.base_port, self._known(name))

    def slow(self, name: str, delay_ms: int) -> None:
        netns.slow(self.cluster.base_port, self._known(name), delay_ms)

    def limit_rate(self, name: str, bps: int) -> None:
        netshape.limit(self.cluster.base_port, self._known(name), bps)

    def kill_controller(self) -> int | None:
        """The slurmctld of this cluster (its marker) whose network is the ctl namespace: the primary's."""
        try:
            ctl = os.stat(netns.NETNS_DIR / self.ctl).st_ino
        except OSError:
            return None
        for p in psutil.process_iter(["name"]):
            with contextlib.suppress(psutil.Error, OSError):
                if (
                    p.info["name"] == "slurmctld"
                    and p.environ().get(MARKER) == str(self.cluster.state_dir)
                    and os.stat(f"/proc/{p.pid}/ns/net").st_ino == ctl
                ):
                    p.kill()
                    log.info("devcluster_controller_killed", pid=p.pid)
                    return p.pid
        return None

    def teardown(self) -> None:
        netns.destroy(self.cluster.base_port)
        nodecpu.remove_all(self.cluster.base_port)

    def task_environment(self) -> dict[str, str]:
        # A node's host name is the host's, which resolves to a loopback address: gloo (and NCCL's socket
        # transport) bound to it cannot reach the other nodes. Their link is the namespace's one interface.
        return {"GLOO_SOCKET_IFNAME": netns.NODE_IF, "NCCL_SOCKET_IFNAME": netns.NODE_IF}


MODES: dict[Isolation, Callable[[Cluster], IsolationMode]] = {
    Isolation.NONE: HostIsolation,
    Isolation.NETNS: NetnsIsolation,
}


def mode_for(isolation: Isolation, cluster: Cluster) -> IsolationMode:
    """The mode's object; raises ConfigError when the cluster asks for what the mode cannot give."""
    return MODES[isolation](cluster)
