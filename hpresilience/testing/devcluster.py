"""A real Slurm cluster on one machine: one slurmctld and N slurmd daemons.

Each node has its own name (n1..nN), address and port; everything lives in one state directory, nothing is
written to /etc (devconf.py). How the nodes are separated, loopback addresses on the host or a network and PID
namespace each, is the cluster's isolation mode (isolation.py): DevCluster calls it and never asks which it is.
Daemons are started with the environment marker HPRESILIENCE_DEVCLUSTER=<state dir>: `down` stops exactly the
processes of this cluster (devprocs.py).

It behaves like a production cluster where that changes what our code sees: accounting through a
private MariaDB + slurmdbd (devaccounting.py) when their packages are installed, process tracking by
cgroup (every process of a cancelled step dies, also those that left its process group), and on request
a production-size node table of powered-down cloud nodes that never run jobs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from hpresilience.errors import ConfigError, EnvironmentMissing, HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.testing import devaccounting, devconf, devprocs, nodecpu, slurmroot
from hpresilience.testing.devconf import EXTRA_NODE_PREFIX, node_names
from hpresilience.testing.devprocs import MARKER, DevclusterError
from hpresilience.testing.isolation import Cluster, IsolationMode, mode_for
from hpresilience.testing.netns import Isolation
from hpresilience.testing.slurmroot import SlurmRelease

__all__ = ["EXTRA_NODE_PREFIX", "DevCluster", "DevclusterError"]  # what commands and tests import from here

log = get_logger("hpresilience.devcluster")

ISOLATION_FILE = "isolation"  # in a cluster's state directory: how its nodes are separated


class DevCluster:
    def __init__(
        self,
        state_dir: Path | str,
        nodes: int = 4,
        base_port: int = 17817,
        overrides: Mapping[str, str] | None = None,
        bin_dir: str = "",
        *,
        accounting: bool | None = None,
        extra_nodes: int = 0,
        proctrack: str = "auto",
        slurm: SlurmRelease | None = None,
        isolation: Isolation | None = None,
        backup_controller: bool = False,
    ) -> None:
        """accounting: None starts MariaDB + slurmdbd when their packages are installed (else logs the apt
        line and runs without); True requires them. proctrack: auto uses cgroup v1 where it is mounted.
        slurm: the release its daemons run (None: the one recorded in the state directory, else this process's);
        a release other than the host's runs inside its Debian root (slurmroot.py). isolation: netns puts each node
        in its own network and PID namespace (netns.py; None: as recorded in the state directory, else none)."""
        devconf.check_proctrack(proctrack)
        if extra_nodes < 0:
            raise ConfigError(f"extra_nodes must be >= 0, not {extra_nodes}")
        self.state_dir = Path(state_dir).absolute()
        self.nodes = nodes
        self.base_port = base_port
        self.overrides = dict(overrides or {})
        self.bin_dir = bin_dir
        self.want_accounting = accounting
        self.extra_nodes = extra_nodes
        self.proctrack = proctrack
        self.release = slurm or self.recorded_release() or slurmroot.current_release()
        self.accounting = devaccounting.Accounting(self.state_dir, base_port + 2, base_port + 3, self._spawn)
        self.backup_controller = backup_controller
        self.mode: IsolationMode = mode_for(
            isolation or self.recorded_isolation() or Isolation.NONE,
            Cluster(
                state_dir=self.state_dir,
                base_port=base_port,
                names=self.names(),
                release=self.release,
                accounting=accounting,
                backup_controller=backup_controller,
                spawn=self._spawn,
                log_tail=self.log_tail,
            ),
        )
        if backup_controller and accounting is None:
            self.want_accounting = False
        self.accounting.listening = self.mode.listening

    # -- paths and configuration ---------------------------------------------------------------------
    @property
    def conf_path(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def isolation(self) -> Isolation:
        return self.mode.isolation

    @property
    def netns(self) -> bool:
        """Whether the nodes are hosts of their own (for callers that explain what a mode cannot do)."""
        return self.isolation is Isolation.NETNS

    def names(self) -> list[str]:
        return node_names(self.nodes)

    def recorded_release(self) -> SlurmRelease | None:
        """The release this state directory's cluster was started with (None before the first `up`)."""
        try:
            return SlurmRelease.parse((self.state_dir / slurmroot.RELEASE_FILE).read_text())
        except (OSError, ConfigError):
            return None

    def recorded_isolation(self) -> Isolation | None:
        try:
            return Isolation.parse((self.state_dir / ISOLATION_FILE).read_text())
        except (OSError, ConfigError):
            return None

    def node_address(self, index: int) -> str:
        return self.mode.node_address(index)

    def command_prefix(self) -> list[str]:
        """argv prefix that puts a command where the cluster's controller is reachable (its network namespace)."""
        return self.mode.command_prefix()

    def root_prefix(self) -> list[str]:
        """argv prefix entering this cluster's Slurm root from the host ([] for the host's Slurm or inside it)."""
        return slurmroot.prefix(self.release, [str(self.state_dir)])

    def needs_root_entry(self) -> bool:
        return devconf.needs_root_entry(self.release)

    def env(self) -> dict[str, str]:
        """The environment a Slurm command needs to talk to this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf_path)
        # The cluster's nodes share this machine's cores: one intra-op thread per rank (torchrun's default for
        # several ranks per host), or each rank's idle OpenMP worker spins on the cores the others need.
        env.setdefault("OMP_NUM_THREADS", "1")
        env["TMPDIR"] = str(self.state_dir / "tmp")  # a job's temporary files (torchrun's, never removed) go with it
        return env

    def client(self, timeout: float = 15.0, retries: int = 3) -> SlurmClient:
        if self.needs_root_entry():
            # The host's 22.05 commands cannot talk to a newer slurmctld (Slurm accepts clients two releases back).
            raise EnvironmentMissing(
                f"this cluster runs Slurm {self.release.value}: query it from inside its root "
                "(hpresilience devcluster exec -- CMD)"
            )
        return SlurmClient(self.mode.command_runner(self.bin_dir, timeout, retries, 0.3, self.env()))

    def settings(self) -> dict[str, str]:
        return devconf.settings(
            self.state_dir,
            self.base_port,
            self.mode.controller_hosts()[0],
            self.resolved_proctrack(),
            shared_state=len(self.mode.controller_hosts()) > 1,
            accounting=self.accounting.slurm_conf_settings() if self.accounting_wanted() else None,
            extra_nodes=self.extra_nodes,
            overrides=self.overrides,
            release=self.release,
            task_prolog=bool(self.mode.task_environment()),
        )

    def render_conf(self) -> str:
        port0 = self.base_port + 10
        nodes = [(name, self.node_address(i), port0 + i) for i, name in enumerate(self.names(), start=1)]
        return devconf.render_conf(self.settings(), self.mode.controller_hosts()[1:], nodes, self.extra_nodes)

    def resolved_proctrack(self) -> str:
        """cgroup where Slurm 22.05 can use it here (cgroup v1 freezer mounted and writable), else pgid."""
        return devconf.resolve_proctrack(self.proctrack)

    def accounting_wanted(self) -> bool:
        """Whether this cluster runs with slurmdbd: the written slurm.conf decides once the cluster exists."""
        if self.conf_path.exists() and self.want_accounting is None:
            return "accounting_storage/slurmdbd" in self.conf_path.read_text(errors="replace")
        if self.want_accounting is not None:
            return self.want_accounting
        return not devaccounting.missing_tools()

    # -- processes -----------------------------------------------------------------------------------
    def _tool(self, name: str) -> str:
        return devconf.slurm_tool(name, self.release, self.bin_dir)

    def check_installed(self) -> None:
        devconf.check_installed(self.release, self.bin_dir)

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: daemons, the slurmstepds they fork, job scripts and tasks."""
        return devprocs.cluster_processes(self.state_dir)

    def daemon_pids(self) -> dict[str, int]:
        """name -> pid for slurmctld, each node's slurmd and the accounting daemons that are alive."""
        me = str(self.state_dir)
        out: dict[str, int] = {}
        if (pid := devprocs.pidfile_pid(self.state_dir / "slurmctld.pid", me)) is not None:
            out["slurmctld"] = pid
        out.update(self.mode.node_pids())
        for key, pidfile in self.accounting.pidfiles().items():
            if (pid := devprocs.pidfile_pid(pidfile, me)) is not None:
                out[key] = pid
        return out

    def _spawn(
        self, argv: list[str], foreground: bool = False, where: list[str] | None = None, log_name: str | None = None
    ) -> None:
        """Start a daemon with our marker. Slurm's daemons fork into the background and chdir to / (-f must be
        absolute: it is); a `foreground` one (mariadbd, a node's nsinit) is detached into its own session here,
        its output in log/<log_name or its program's name>.out."""
        env = {**self.env(), MARKER: str(self.state_dir)}
        out = self.log_dir / f"{log_name or os.path.basename(argv[0])}.out" if foreground else None
        argv = [*(self.command_prefix() if where is None else where), *self.root_prefix(), *argv]
        devprocs.spawn(argv, env, self.state_dir, out, self.log_tail)

    def start_node(self, name: str, timeout: float = 10.0, *, booted: bool = False) -> None:
        """booted: slurmd -b, which reports the node rebooted (the nodes share the host's boot time, and
        slurmctld ends a `scontrol reboot` only when a node reports a boot after the request)."""
        (self.state_dir / "spool" / name).mkdir(parents=True, exist_ok=True)
        self.mode.start_node(name, self._tool("slurmd"), self.conf_path, timeout, ["-b"] if booted else [])
        log.info("devcluster_node_started", node=name)

    def partition(self, name: str) -> None:
        """Cut the node's link (its processes keep running); a netns cluster's only."""
        self.mode.partition(name)
        log.info("devcluster_node_partitioned", node=name)

    def heal(self, name: str) -> None:
        self.mode.heal(name)
        log.info("devcluster_node_healed", node=name)

    def slow(self, name: str, delay_ms: int | None = None, *, bps: int | None = None, cpu: float | None = None) -> None:
        """Delay the node's link by delay_ms each way (netem; 0 removes it), cap it at bps bits/s each way (tbf; 0
        removes it): a netns cluster's only; give the node `cpu` of one CPU (its cgroup's quota; 1 removes it)."""
        if delay_ms is not None:
            self.mode.slow(name, delay_ms)
        if bps is not None:
            self.mode.limit_rate(name, bps)
        if cpu is not None:
            if name not in self.names():
                raise ConfigError(f"unknown node {name!r}; known: {', '.join(self.names())}")
            nodecpu.set_quota(self.base_port, name, cpu)
        log.info("devcluster_node_slowed", node=name, delay_ms=delay_ms, bps=bps, cpu=cpu)

    def kill_primary_controller(self) -> int | None:
        """SIGKILL the primary slurmctld of a cluster whose controller is a host of its own (a crashed head
        node); its pid, or None."""
        return self.mode.kill_controller()

    def kill_node(self, name: str, sig: int = signal.SIGKILL, wait: bool = True) -> int | None:
        """Kill one node's slurmd (a crashed node, for tests); its running steps are left alone. Its pid, or None
        when it was not running; `wait`: until it is gone (its reaping by init took 1.5 s here)."""
        pid = self.daemon_pids().get(name)
        if pid is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if wait:
            devprocs.wait_gone([pid], 10.0)
        log.info("devcluster_node_killed", node=name, pid=pid)
        return pid

    def node_port(self, name: str) -> int:
        return self.base_port + 10 + self.names().index(name) + 1

    def restart_node(self, name: str, timeout: float = 15.0, *, booted: bool = False) -> None:
        """The devcluster's 'replace' of a node: everything that ran on it stops (slurmd and the slurmstepds
        it forked, which inherit slurmd's listening socket), then a fresh slurmd starts under the same name
        (booted: reporting a reboot, what a RebootProgram's reboot looks like to slurmctld)."""
        pid = self.daemon_pids().get(name)
        if pid is not None:
            devprocs.stop(devprocs.process_tree(pid), 5.0)
        port = self.node_port(name)
        deadline = time.monotonic() + timeout
        while self.mode.node_listening(name, port) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.start_node(name, booted=booted)

    # -- lifecycle -----------------------------------------------------------------------------------
    def is_up(self) -> bool:
        pids = self.daemon_pids()
        daemons = ["slurmctld", *self.names()] + (["mariadbd", "slurmdbd"] if self.accounting_wanted() else [])
        return all(d in pids for d in daemons)

    def up(self, timeout: float = 30.0, progress: Callable[[str], None] | None = None) -> float:
        """Start everything (unless already up) and wait for every node idle; returns seconds taken."""
        if self.needs_root_entry():
            # MariaDB's set-up and the wait for idle nodes run Slurm's and MariaDB's clients: from inside the root.
            raise EnvironmentMissing(
                f"Slurm {self.release.value} runs inside its root: start this cluster with "
                f"`hpresilience devcluster up --slurm {self.release.value}`"
            )
        self.check_installed()
        started = time.monotonic()
        if self.is_up() and self.conf_path.exists():
            self.wait_idle(timeout, progress)
            return time.monotonic() - started
        if self.processes():
            self.down(remove=False)
        for sub in ("ctld", "spool", "log", "tmp"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        (self.state_dir / "tmp").chmod(0o1777)  # as /tmp is (the state directory above it is root's alone)
        self.state_dir.chmod(0o700)  # holds the database and its password: nobody else's business
        if self.conf_path.exists():
            self.conf_path.unlink()  # accounting_wanted() must not read a previous cluster's choice
        (self.state_dir / slurmroot.RELEASE_FILE).write_text(self.release.value + "\n")
        (self.state_dir / ISOLATION_FILE).write_text(self.isolation.value + "\n")
        accounting = self.accounting_wanted()
        if self.want_accounting is None and not accounting:
            log.warning(
                "devcluster_accounting_off", missing=devaccounting.missing_tools(), install=devaccounting.APT_LINE
            )
        try:
            self.mode.create()
            if accounting:
                self.accounting.start(self.state_dir, timeout, progress)
            (self.state_dir / "cgroup.conf").write_text(devconf.render_cgroup_conf())
            if self.mode.task_environment():
                prolog = self.state_dir / devconf.TASK_PROLOG
                prolog.write_text(devconf.render_task_prolog(self.mode.task_environment()))
                prolog.chmod(0o755)
            self.conf_path.write_text(self.render_conf())
            self.mode.start_controllers(self._tool("slurmctld"), self.conf_path)
            for name in self.names():
                self.start_node(name)
            self.wait_idle(timeout, progress)
        except BaseException:
            # A cluster that did not come up (a port taken, a daemon that died) must not hold its ports and
            # database: the next cluster on them, or the next test session, would fail the same way.
            self.down(remove=False)
            raise
        took = time.monotonic() - started
        log.info(
            "devcluster_up",
            slurm=self.release.value,
            isolation=self.isolation.value,
            nodes=self.nodes,
            extra_nodes=self.extra_nodes,
            accounting=accounting,
            proctrack=self.resolved_proctrack(),
            seconds=round(took, 2),
            slurm_conf=str(self.conf_path),
        )
        return took

    def wait_idle(self, timeout: float = 30.0, progress: Callable[[str], None] | None = None) -> list[Node]:
        client = self.client(timeout=5.0, retries=0)
        started = time.monotonic()
        next_report = started + 3.0
        last: list[Node] = []
        while True:
            try:
                last = client.nodes(self.names())
                if all(n.is_idle for n in last):
                    return last
            except HPResilienceError:  # slurmctld still starting: keep waiting, the timeout reports it
                last = []
            elapsed = time.monotonic() - started
            if elapsed > timeout:
                states = ", ".join(f"{n.name}={n.state_text}" for n in last) or "slurmctld not answering"
                raise DevclusterError(f"nodes not idle after {elapsed:.0f} s ({states})\n" + self.log_tail())
            if time.monotonic() >= next_report and progress is not None:
                states = ", ".join(f"{n.name}={n.state_text}" for n in last) or "slurmctld starting"
                progress(f"waiting for {self.nodes} nodes to be idle ({elapsed:.0f} s so far): {states}")
                next_report = time.monotonic() + 3.0
            time.sleep(0.1)

    def down(self, remove: bool = True, grace: float = 5.0) -> int:
        """Cancel jobs, stop every process with our marker (TERM, then KILL), remove our directory."""
        if self.conf_path.exists() and "slurmctld" in self.daemon_pids():
            try:
                self.client(timeout=10, retries=0).cancel_jobs_of("root")
            except HPResilienceError:
                pass
            else:
                devprocs.wait_jobs_gone(self.client(timeout=5.0, retries=0), grace)
        procs = self.processes()
        devprocs.stop(procs, grace)
        self.mode.teardown()
        if remove and self.state_dir.exists():
            shutil.rmtree(self.state_dir, ignore_errors=True)
        log.info("devcluster_down", stopped=len(procs), removed=remove)
        return len(procs)

    def log_tail(self, lines: int = 15) -> str:
        return devprocs.log_tail(self.log_dir, lines)
