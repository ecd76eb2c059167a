"""A real Slurm cluster on one machine: one slurmctld and N slurmd daemons.

Each node has its own name (n1..nN), loopback address (127.0.0.11, ...: every 127.x address is
local on Linux) and port; everything lives in one state directory, nothing is written to /etc.
Daemons are started with the environment marker HPRESILIENCE_DEVCLUSTER=<state dir>, which the
slurmstepd processes they fork inherit: `down` stops exactly the processes carrying our marker.

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
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from hpresilience import proc
from hpresilience.errors import ConfigError, EnvironmentMissing, ExternalError, HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.hostlist import compress
from hpresilience.slurm.models import Node
from hpresilience.slurm.runner import CommandRunner
from hpresilience.testing import devaccounting, netns, slurmroot
from hpresilience.testing.netns import Isolation
from hpresilience.testing.slurmroot import SlurmRelease

log = get_logger("hpresilience.devcluster")

MARKER = "HPRESILIENCE_DEVCLUSTER"
DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("scontrol", "sinfo", "squeue", "srun", "sbatch", "salloc", "scancel")
APT_HINT = "apt-get install -y slurm-wlm  (Debian packages slurmctld, slurmd and slurm-client)"
PROCTRACK = ("auto", "cgroup", "pgid")
CGROUP_V1_FREEZER = Path("/sys/fs/cgroup/freezer")
# The production-size table: powered-down p5-like nodes (State=CLOUD) that slurmctld serves but never starts.
EXTRA_NODE_PREFIX = "gpu-st-p5-"
EXTRA_PARTITION = "p5"
ISOLATION_FILE = "isolation"  # in a cluster's state directory: how its nodes are separated
NSINIT = Path(__file__).with_name("nsinit.py")


class DevclusterError(ExternalError):
    """The local cluster could not be started or stopped; the message carries the daemons' log tail."""


def node_names(count: int) -> list[str]:
    return [f"n{i}" for i in range(1, count + 1)]


def node_address(index: int) -> str:
    """1-based node index -> its own loopback address."""
    return f"127.0.0.{10 + index}"  # nodes are capped at 64 by the configuration


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
        if proctrack not in PROCTRACK:
            raise ConfigError(f"unknown proctrack {proctrack!r}; known: {', '.join(PROCTRACK)}")
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
        self.isolation = isolation or self.recorded_isolation() or Isolation.NONE
        self.backup_controller = backup_controller
        if backup_controller and self.isolation is not Isolation.NETNS:
            raise ConfigError("a backup controller needs --isolation netns (a host of its own)")
        if backup_controller and accounting is None:
            self.want_accounting = False
        if backup_controller and accounting:
            raise ConfigError(
                "a backup controller runs without accounting for now (slurmdbd listens on 127.0.0.1 "
                "inside the primary's namespace): add --no-accounting"
            )
        if self.isolation is Isolation.NETNS:
            if self.release.suite is not None:
                raise ConfigError(
                    f"--isolation netns runs only the host's Slurm ({SlurmRelease.HOST.value}) so far, "
                    f"not {self.release.value}"
                )
            ctl = netns.ctl_ns(base_port)
            self.accounting.listening = lambda port: netns.listening(ctl, port)

    # -- paths and configuration ---------------------------------------------------------------------
    @property
    def conf_path(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

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

    @property
    def netns(self) -> bool:
        return self.isolation is Isolation.NETNS

    def node_address(self, index: int) -> str:
        return netns.node_addr(index) if self.netns else node_address(index)

    def command_prefix(self) -> list[str]:
        """argv prefix that puts a command where the cluster's controller is reachable (its network namespace)."""
        return netns.enter(netns.ctl_ns(self.base_port)) if self.netns else []

    def root_prefix(self) -> list[str]:
        """argv prefix entering this cluster's Slurm root from the host ([] for the host's Slurm or inside it)."""
        return slurmroot.prefix(self.release, [str(self.state_dir)])

    def needs_root_entry(self) -> bool:
        return self.release.suite is not None and not slurmroot.inside_root()

    def env(self) -> dict[str, str]:
        """The environment a Slurm command needs to talk to this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf_path)
        return env

    def client(self, timeout: float = 15.0, retries: int = 3) -> SlurmClient:
        if self.needs_root_entry():
            # The host's 22.05 commands cannot talk to a newer slurmctld (Slurm accepts clients two releases back).
            raise EnvironmentMissing(
                f"this cluster runs Slurm {self.release.value}: query it from inside its root "
                "(hpresilience devcluster exec -- CMD)"
            )
        if self.netns:
            return SlurmClient(
                netns.NamespaceRunner(
                    self.command_prefix(),
                    bin_dir=self.bin_dir,
                    timeout=timeout,
                    retries=retries,
                    backoff=0.3,
                    env=self.env(),
                )
            )
        return SlurmClient(CommandRunner(self.bin_dir, timeout=timeout, retries=retries, backoff=0.3, env=self.env()))

    def settings(self) -> dict[str, str]:
        d = self.state_dir
        s = {
            "ClusterName": "hpdev",
            "SlurmctldHost": (
                f"{netns.PRIMARY_NAME}({netns.CTL_ADDR})"
                if self.backup_controller
                else f"localhost({netns.CTL_ADDR if self.netns else '127.0.0.1'})"
            ),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            # Debian's build ships auth/none and cred/none: no munge needed on one machine.
            "AuthType": "auth/none",
            "CredType": "cred/none",
            "ProctrackType": f"proctrack/{self.resolved_proctrack()}",
            "TaskPlugin": "task/none",
            # Job ids of clusters running side by side (tests beside a demo) never meet: with proctrack/cgroup
            # every cluster's node n1 shares /sys/fs/cgroup/freezer/slurm_n1/uid_0/job_<id>.
            "FirstJobId": str(self.base_port * 1000),
            "SelectType": "select/linear",
            "MpiDefault": "none",
            "ReturnToService": "2",
            # The expand-dependency path of growing a job is refused without this.
            "SchedulerParameters": "permit_job_expansion,bf_interval=2",
            "SlurmctldPort": str(self.base_port),
            "SlurmdPort": str(self.base_port + 1),
            "StateSaveLocation": f"{d}/ctld",
            "SlurmdSpoolDir": f"{d}/spool/%n",
            "SlurmctldPidFile": f"{d}/slurmctld.pid",
            "SlurmdPidFile": f"{d}/slurmd-%n.pid",
            "SlurmctldLogFile": f"{d}/log/slurmctld.log",
            "SlurmdLogFile": f"{d}/log/slurmd-%n.log",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "SlurmdTimeout": "30",
            "KillWait": "5",
            "MinJobAge": "300",
            "InactiveLimit": "0",
        }
        if self.backup_controller:  # the backup's slurm.conf differs in its pid and log file only
            s["DebugFlags"] = "NO_CONF_HASH"
        if self.accounting_wanted():
            s.update(self.accounting.slurm_conf_settings())
        if self.extra_nodes:
            # Powered-down cloud nodes: listed by sinfo/scontrol (PrivateData=cloud) and never resumed for
            # real, since no job is sent to their partition.
            s.update(
                {
                    "PrivateData": "cloud",
                    "SuspendProgram": "/bin/true",
                    "ResumeProgram": "/bin/true",
                    "GresTypes": "gpu",
                    "SuspendTime": "INFINITE",
                }
            )
        s.update({str(k): str(v) for k, v in self.overrides.items()})
        return s

    def render_conf(self) -> str:
        lines = ["# Written by `hpresilience devcluster up`; removed by `down`."]
        lines += [f"{k}={v}" for k, v in self.settings().items()]
        if self.backup_controller:  # a second SlurmctldHost line: the backup, on a host of its own
            lines.append(f"SlurmctldHost={netns.BACKUP_NAME}({netns.BACKUP_ADDR})")
        port0 = self.base_port + 10
        for i, name in enumerate(self.names(), start=1):
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr={self.node_address(i)} Port={port0 + i} "
                "CPUs=1 RealMemory=1000 State=UNKNOWN"
            )
        if self.extra_nodes:
            lines.append(
                f"NodeName={EXTRA_NODE_PREFIX}[1-{self.extra_nodes}] NodeHostname=localhost "
                "NodeAddr=127.0.9.1 CPUs=192 Boards=1 SocketsPerBoard=2 CoresPerSocket=48 ThreadsPerCore=2 "
                "RealMemory=2000000 Gres=gpu:8 Features=p5,p5.48xlarge,efa,nvlink Weight=100 State=CLOUD"
            )
        lines.append(f"PartitionName=debug Nodes={compress(self.names())} Default=YES MaxTime=INFINITE State=UP")
        if self.extra_nodes:
            lines.append(
                f"PartitionName={EXTRA_PARTITION} Nodes={EXTRA_NODE_PREFIX}[1-{self.extra_nodes}] "
                "MaxTime=INFINITE State=UP"
            )
        return "\n".join(lines) + "\n"

    def render_cgroup_conf(self) -> str:
        # Only process tracking: constraining cores or memory would fight the other slurmd on this host.
        return (
            "\n".join(
                [
                    "# Written by `hpresilience devcluster up`.",
                    "CgroupPlugin=cgroup/v1",
                    "CgroupAutomount=no",
                    "CgroupMountpoint=/sys/fs/cgroup",
                    "ConstrainCores=no",
                    "ConstrainRAMSpace=no",
                    "ConstrainDevices=no",
                ]
            )
            + "\n"
        )

    def resolved_proctrack(self) -> str:
        """cgroup where Slurm 22.05 can use it here (cgroup v1 freezer mounted and writable), else pgid."""
        if self.proctrack != "auto":
            return self.proctrack
        return "cgroup" if cgroup_v1_usable() else "pgid"

    def accounting_wanted(self) -> bool:
        """Whether this cluster runs with slurmdbd: the written slurm.conf decides once the cluster exists."""
        if self.conf_path.exists() and self.want_accounting is None:
            return "accounting_storage/slurmdbd" in self.conf_path.read_text(errors="replace")
        if self.want_accounting is not None:
            return self.want_accounting
        return not devaccounting.missing_tools()

    # -- processes -----------------------------------------------------------------------------------
    def _tool(self, name: str) -> str:
        if self.needs_root_entry():
            root = slurmroot.root_path(self.release)
            for d in ("/usr/sbin", "/usr/bin"):
                if root is not None and os.path.exists(f"{root}{d}/{name}"):
                    return f"{d}/{name}"
            raise EnvironmentMissing(
                f"`{name}` not found in the Slurm {self.release.value} root {root}; "
                f"rebuild it: rm -r {root} {root}.ready; hpresilience devcluster up "
                f"--slurm {self.release.value}"
            )
        path = os.path.join(self.bin_dir, name) if self.bin_dir else shutil.which(name)
        if not path or not os.path.exists(path):
            raise EnvironmentMissing(f"`{name}` not found; install Slurm: {APT_HINT}")
        return path

    def check_installed(self) -> None:
        if self.needs_root_entry():
            for tool in (*DAEMONS, *CLIENTS):
                self._tool(tool)
            return
        missing = [
            t for t in (*DAEMONS, *CLIENTS) if not (os.path.join(self.bin_dir, t) if self.bin_dir else shutil.which(t))
        ]
        if missing:
            raise EnvironmentMissing(f"Slurm commands missing: {', '.join(missing)}; install them: {APT_HINT}")

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: the daemons (our marker), the slurmstepds they fork (slurmd
        starts them with an empty environment, but their cwd is our log directory), and every descendant
        of those (job scripts and tasks)."""
        me = str(self.state_dir)
        dirs = _dir_ids(self.state_dir)
        found: dict[int, psutil.Process] = {}
        for p in psutil.process_iter(["pid"]):
            try:
                ours = p.environ().get(MARKER) == me or (
                    p.name().startswith("slurmstepd") and (_under(p.cwd(), me) or _cwd_id(p.pid) in dirs)
                )
                if ours:
                    found[p.pid] = p
                    for child in p.children(recursive=True):
                        found[child.pid] = child
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        found.pop(os.getpid(), None)
        for parent in psutil.Process().parents():
            found.pop(parent.pid, None)
        return list(found.values())

    def daemon_pids(self) -> dict[str, int]:
        """name -> pid for slurmctld and each node's slurmd that is alive."""
        out: dict[str, int] = {}
        pidfiles = [("slurmctld", self.state_dir / "slurmctld.pid")]
        pidfiles += [(n, self.state_dir / f"slurmd-{n}.pid") for n in self.names()]
        pidfiles += list(self.accounting.pidfiles().items())
        for key, pidfile in pidfiles:
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            if key in self.names() and self.netns:
                continue  # the pid file holds the pid inside the node's PID namespace: found below
            if _alive_with_marker(pid, str(self.state_dir)):
                out[key] = pid
        if self.netns:
            out.update(netns.slurmd_pids(self.names(), MARKER, str(self.state_dir)))
        return out

    def _spawn(self, argv: list[str], foreground: bool = False, where: list[str] | None = None) -> None:
        """Start a daemon with our marker. Slurm's daemons fork into the background and chdir to / (-f must be
        absolute: it is); a `foreground` one (mariadbd) is detached into its own session here instead."""
        env = self.env()
        env[MARKER] = str(self.state_dir)
        name = os.path.basename(argv[0])
        argv = [*(self.command_prefix() if where is None else where), *self.root_prefix(), *argv]
        if foreground:
            with open(self.log_dir / f"{name}.out", "ab") as out:
                subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=self.state_dir,
                )
            return
        # Slurm's daemons fork and leave the group themselves; nothing left in it may be killed on exit either.
        res = proc.run(argv, 30, env=env, kill_leftovers=False)
        if not res.ok:
            raise DevclusterError(f"{res.describe(tail=300)}\n" + self.log_tail())

    def start_node(self, name: str, timeout: float = 10.0, *, booted: bool = False) -> None:
        """booted: slurmd -b, which reports the node rebooted (the nodes share the host's boot time, and
        slurmctld ends a `scontrol reboot` only when a node reports a boot after the request)."""
        (self.state_dir / "spool" / name).mkdir(parents=True, exist_ok=True)
        extra = ["-b"] if booted else []
        if self.netns:
            self._spawn_isolated(name, timeout, extra)
        else:
            self._spawn([self._tool("slurmd"), "-f", str(self.conf_path), "-N", name, *extra])
        log.info("devcluster_node_started", node=name)

    def _spawn_isolated(self, name: str, timeout: float, extra: list[str]) -> None:
        """slurmd in the node's network namespace and in a PID namespace of its own with its own /proc, under
        nsinit.py as PID 1 (a PID namespace ends with its PID 1: that must not be slurmd, whose death leaves the
        steps running on a real host). The mount namespace that --mount-proc needs keeps /sys: cgroups work."""
        env = self.env()
        env[MARKER] = str(self.state_dir)
        argv = [
            *netns.enter(netns.node_ns(self.base_port, name)),
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-I",
            "-S",
            str(NSINIT),
            self._tool("slurmd"),
            "-f",
            str(self.conf_path),
            "-N",
            name,
            *extra,
        ]
        with open(self.log_dir / f"nsinit-{name}.out", "ab") as out:
            subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.state_dir,
            )
        deadline = time.monotonic() + timeout
        while name not in self.daemon_pids():
            if time.monotonic() > deadline:
                raise DevclusterError(
                    f"slurmd of {name} did not start in its namespaces within {timeout:g} s\n" + self.log_tail()
                )
            time.sleep(0.05)

    # -- nodes as hosts (--isolation netns) ------------------------------------------------------------
    def _require_netns(self, name: str) -> None:
        if not self.netns:
            raise ConfigError(
                f"this cluster shares the host's network (isolation {self.isolation.value}): start it "
                "with `devcluster up --isolation netns` to cut or slow a node's link"
            )
        if name not in self.names():
            raise ConfigError(f"unknown node {name!r}; known: {', '.join(self.names())}")

    def partition(self, name: str) -> None:
        """Cut the node's link (its processes keep running)."""
        self._require_netns(name)
        netns.partition(self.base_port, name)
        log.info("devcluster_node_partitioned", node=name)

    def heal(self, name: str) -> None:
        self._require_netns(name)
        netns.heal(self.base_port, name)
        log.info("devcluster_node_healed", node=name)

    def slow(self, name: str, delay_ms: int) -> None:
        """Delay the node's link by delay_ms each way (0 removes the delay)."""
        self._require_netns(name)
        netns.slow(self.base_port, name, delay_ms)
        log.info("devcluster_node_slowed", node=name, delay_ms=delay_ms)

    def kill_primary_controller(self) -> int | None:
        """SIGKILL the slurmctld in the cluster's ctl namespace (a crashed head node); its pid, or None."""
        try:
            ctl = os.stat(netns.NETNS_DIR / netns.ctl_ns(self.base_port)).st_ino
        except OSError:
            return None
        for p in psutil.process_iter(["name"]):
            with contextlib.suppress(psutil.Error, OSError):
                if (
                    p.info["name"] == "slurmctld"
                    and p.environ().get(MARKER) == str(self.state_dir)
                    and os.stat(f"/proc/{p.pid}/ns/net").st_ino == ctl
                ):
                    p.kill()
                    log.info("devcluster_controller_killed", pid=p.pid)
                    return p.pid
        return None

    def kill_node(self, name: str, sig: int = signal.SIGKILL) -> bool:
        """Kill one node's slurmd (a crashed node, for tests); its running steps are left alone."""
        pid = self.daemon_pids().get(name)
        if pid is None:
            return False
        os.kill(pid, sig)
        _wait_gone([pid], 10.0)
        log.info("devcluster_node_killed", node=name, pid=pid)
        return True

    def node_port(self, name: str) -> int:
        return self.base_port + 10 + self.names().index(name) + 1

    def restart_node(self, name: str, timeout: float = 15.0, *, booted: bool = False) -> None:
        """The devcluster's 'replace' of a node: everything that ran on it stops (slurmd and the slurmstepds
        it forked, which inherit slurmd's listening socket), then a fresh slurmd starts under the same name
        (booted: reporting a reboot, what a RebootProgram's reboot looks like to slurmctld)."""
        pid = self.daemon_pids().get(name)
        if pid is not None:
            try:
                root = psutil.Process(pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                procs = []
            for p in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGTERM)
            _, alive = psutil.wait_procs(procs, timeout=5)
            for p in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            psutil.wait_procs(alive, timeout=5)
        port = self.node_port(name)
        deadline = time.monotonic() + timeout
        ns = netns.node_ns(self.base_port, name)
        while (netns.listening(ns, port) if self.netns else _port_listening(port)) and time.monotonic() < deadline:
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
        for sub in ("ctld", "spool", "log"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
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
            if self.netns:
                netns.destroy(self.base_port)  # what a crashed cluster on these ports left
                netns.create(self.base_port, self.names(), backup=self.backup_controller)
            if accounting:
                self.accounting.start(self.state_dir, timeout, progress)
            (self.state_dir / "cgroup.conf").write_text(self.render_cgroup_conf())
            self.conf_path.write_text(self.render_conf())
            if self.backup_controller:
                primary = [*self.command_prefix(), *netns.with_hostname(netns.PRIMARY_NAME)]
                self._spawn([self._tool("slurmctld"), "-c", "-f", str(self.conf_path)], where=primary)
                # No -c: on taking over, the backup loads the state the primary saved (the same directory). Its own
                # pid file: a slurmctld starting kills the one named in its pid file ("killing old slurmctld").
                backup_conf = self.state_dir / "slurm-backup.conf"
                backup_conf.write_text(
                    self.conf_path.read_text()
                    .replace(
                        f"SlurmctldPidFile={self.state_dir}/slurmctld.pid",
                        f"SlurmctldPidFile={self.state_dir}/backup.pid",
                    )
                    .replace("log/slurmctld.log", "log/slurmctld-backup.log")
                )
                self._spawn(
                    [self._tool("slurmctld"), "-f", str(backup_conf)],
                    where=[*netns.enter(netns.backup_ns(self.base_port)), *netns.with_hostname(netns.BACKUP_NAME)],
                )
            else:
                self._spawn([self._tool("slurmctld"), "-c", "-f", str(self.conf_path)])
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
                self._wait_jobs_gone(grace)
        procs = self.processes()
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=grace)
        # Namespaces are found by their names (base port), not by the state directory: also after a crash.
        if self.netns or shutil.which("ip"):
            netns.destroy(self.base_port)
        if remove and self.state_dir.exists():
            shutil.rmtree(self.state_dir, ignore_errors=True)
        log.info("devcluster_down", stopped=len(procs), removed=remove)
        return len(procs)

    def _wait_jobs_gone(self, timeout: float) -> None:
        client = self.client(timeout=5.0, retries=0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if all(j.is_finished for j in client.jobs()):
                    return
            except HPResilienceError:  # a dying controller: the signals that follow finish its jobs
                return
            time.sleep(0.2)

    def log_tail(self, lines: int = 15) -> str:
        out: list[str] = []
        for f in sorted(self.log_dir.glob("*.log")) if self.log_dir.exists() else []:
            tail = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {f.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(out) or "(no daemon logs yet)"


def cgroup_v1_usable() -> bool:
    """Slurm 22.05's proctrack/cgroup needs the v1 freezer hierarchy, writable (as root)."""
    try:
        return (CGROUP_V1_FREEZER / "cgroup.procs").exists() and os.access(CGROUP_V1_FREEZER, os.W_OK)
    except OSError:
        return False


def _port_listening(port: int) -> bool:
    try:
        return any(
            c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
            for c in psutil.net_connections(kind="tcp")
        )
    except (psutil.AccessDenied, OSError):
        return False


def _dir_ids(root: Path) -> set[tuple[int, int]]:
    """(device, inode) of every directory of a state directory."""
    out: set[tuple[int, int]] = set()
    for d, _, _ in os.walk(root) if root.exists() else []:
        with contextlib.suppress(OSError):
            st = os.stat(d)
            out.add((st.st_dev, st.st_ino))
    return out


def _cwd_id(pid: int) -> tuple[int, int] | None:
    """The (device, inode) of a process's working directory. A slurmstepd of a cluster in a Slurm root runs in
    another mount namespace, where its cwd reads as a path under the root's directory (or another bind), not
    under our state directory: the directory itself is the same."""
    try:
        st = os.stat(f"/proc/{pid}/cwd")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _under(path: str, root: str) -> bool:
    path = path.removesuffix(" (deleted)")
    return path == root or path.startswith(root + os.sep)


def _alive_with_marker(pid: int, marker: str) -> bool:
    try:
        return psutil.Process(pid).environ().get(MARKER) == marker
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return False


def _wait_gone(pids: list[int], timeout: float) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=timeout)
