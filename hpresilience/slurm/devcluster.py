"""A real Slurm cluster on one machine: one slurmctld and N slurmd daemons.

Each node has its own name (n1..nN), loopback address (127.0.0.11, ...: every 127.x address is
local on Linux) and port; everything lives in one state directory, nothing is written to /etc.
Daemons are started with the environment marker HPRESILIENCE_DEVCLUSTER=<state dir>, which the
slurmstepd processes they fork inherit: `down` stops exactly the processes carrying our marker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from hpresilience.errors import EnvironmentMissing, ExternalError, HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.slurm.runner import CommandRunner

log = get_logger("hpresilience.devcluster")

MARKER = "HPRESILIENCE_DEVCLUSTER"
DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("scontrol", "sinfo", "squeue", "srun", "sbatch", "salloc", "scancel")
APT_HINT = "apt-get install -y slurm-wlm  (Debian packages slurmctld, slurmd and slurm-client)"


class DevclusterError(ExternalError):
    """The local cluster could not be started or stopped; the message carries the daemons' log tail."""


def node_names(count: int) -> list[str]:
    return [f"n{i}" for i in range(1, count + 1)]


def node_address(index: int) -> str:
    """1-based node index -> its own loopback address."""
    return f"127.0.0.{10 + index}"  # nodes are capped at 64 by the configuration


class DevCluster:
    def __init__(self, state_dir: Path | str, nodes: int = 4, base_port: int = 17817,
                 overrides: Mapping[str, str] | None = None, bin_dir: str = "") -> None:
        self.state_dir = Path(state_dir).absolute()
        self.nodes = nodes
        self.base_port = base_port
        self.overrides = dict(overrides or {})
        self.bin_dir = bin_dir

    # -- paths and configuration ---------------------------------------------------------------------
    @property
    def conf_path(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    def names(self) -> list[str]:
        return node_names(self.nodes)

    def env(self) -> dict[str, str]:
        """The environment a Slurm command needs to talk to this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf_path)
        return env

    def client(self, timeout: float = 15.0, retries: int = 3) -> SlurmClient:
        return SlurmClient(CommandRunner(self.bin_dir, timeout=timeout, retries=retries, backoff=0.3, env=self.env()))

    def settings(self) -> dict[str, str]:
        d = self.state_dir
        s = {
            "ClusterName": "hpdev",
            "SlurmctldHost": "localhost(127.0.0.1)",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            # Debian's build ships auth/none and cred/none: no munge needed on one machine.
            "AuthType": "auth/none",
            "CredType": "cred/none",
            "ProctrackType": "proctrack/pgid",
            "TaskPlugin": "task/none",
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
            "SlurmdTimeout": "30",
            "KillWait": "5",
            "MinJobAge": "300",
            "InactiveLimit": "0",
        }
        s.update({str(k): str(v) for k, v in self.overrides.items()})
        return s

    def render_conf(self) -> str:
        lines = ["# Written by `hpresilience devcluster up`; removed by `down`."]
        lines += [f"{k}={v}" for k, v in self.settings().items()]
        port0 = self.base_port + 10
        for i, name in enumerate(self.names(), start=1):
            lines.append(f"NodeName={name} NodeHostname=localhost NodeAddr={node_address(i)} Port={port0 + i} "
                         "CPUs=1 RealMemory=1000 State=UNKNOWN")
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    # -- processes -----------------------------------------------------------------------------------
    def _tool(self, name: str) -> str:
        path = os.path.join(self.bin_dir, name) if self.bin_dir else shutil.which(name)
        if not path or not os.path.exists(path):
            raise EnvironmentMissing(f"`{name}` not found; install Slurm: {APT_HINT}")
        return path

    def check_installed(self) -> None:
        missing = [t for t in (*DAEMONS, *CLIENTS) if not (os.path.join(self.bin_dir, t) if self.bin_dir
                                                            else shutil.which(t))]
        if missing:
            raise EnvironmentMissing(f"Slurm commands missing: {', '.join(missing)}; install them: {APT_HINT}")

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: the daemons (our marker), the slurmstepds they fork (slurmd
        starts them with an empty environment, but their cwd is our log directory), and every descendant
        of those (job scripts and tasks)."""
        me = str(self.state_dir)
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["pid"]):
            try:
                ours = proc.environ().get(MARKER) == me or (
                    proc.name().startswith("slurmstepd") and _under(proc.cwd(), me))
                if ours:
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
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
        for key, pidfile in [("slurmctld", self.state_dir / "slurmctld.pid")] + [
                (n, self.state_dir / f"slurmd-{n}.pid") for n in self.names()]:
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            if _alive_with_marker(pid, str(self.state_dir)):
                out[key] = pid
        return out

    def _spawn(self, argv: list[str]) -> None:
        env = self.env()
        env[MARKER] = str(self.state_dir)
        # Both daemons fork into the background and chdir to /; -f must be absolute (it is).
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
        if res.returncode != 0:
            raise DevclusterError(f"`{' '.join(argv)}` exited {res.returncode}: {res.stderr.strip()[-300:]}\n"
                                  + self.log_tail())

    def start_node(self, name: str) -> None:
        (self.state_dir / "spool" / name).mkdir(parents=True, exist_ok=True)
        self._spawn([self._tool("slurmd"), "-f", str(self.conf_path), "-N", name])
        log.info("devcluster_node_started", node=name)

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

    def restart_node(self, name: str, timeout: float = 15.0) -> None:
        """The devcluster's 'replace' of a node: everything that ran on it stops (slurmd and the slurmstepds
        it forked, which inherit slurmd's listening socket), then a fresh slurmd starts under the same name."""
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
        while _port_listening(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.start_node(name)

    # -- lifecycle -----------------------------------------------------------------------------------
    def is_up(self) -> bool:
        pids = self.daemon_pids()
        return "slurmctld" in pids and all(n in pids for n in self.names())

    def up(self, timeout: float = 30.0, progress: Callable[[str], None] | None = None) -> float:
        """Start everything (unless already up) and wait for every node idle; returns seconds taken."""
        self.check_installed()
        started = time.monotonic()
        if self.is_up() and self.conf_path.exists():
            self.wait_idle(timeout, progress)
            return time.monotonic() - started
        if self.processes():
            self.down(remove=False)
        for sub in ("ctld", "spool", "log"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text(self.render_conf())
        self._spawn([self._tool("slurmctld"), "-c", "-f", str(self.conf_path)])
        for name in self.names():
            self.start_node(name)
        self.wait_idle(timeout, progress)
        took = time.monotonic() - started
        log.info("devcluster_up", nodes=self.nodes, seconds=round(took, 2), slurm_conf=str(self.conf_path))
        return took

    def wait_idle(self, timeout: float = 30.0, progress: Callable[[str], None] | None = None) -> list[Node]:
        client = self.client(timeout=5.0, retries=0)
        started = time.monotonic()
        next_report = started + 3.0
        last: list[Node] = []
        while True:
            try:
                last = client.nodes()
                if len(last) == self.nodes and all(n.is_idle for n in last):
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
                subprocess.run([self._tool("scancel"), "--full", "--quiet", "--state=RUNNING,PENDING,SUSPENDED",
                                "--user=root"], env=self.env(), capture_output=True, timeout=10, check=False)
            except (subprocess.TimeoutExpired, EnvironmentMissing, OSError):
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
        out = []
        for f in sorted(self.log_dir.glob("*.log")) if self.log_dir.exists() else []:
            tail = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {f.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(out) or "(no daemon logs yet)"


def _port_listening(port: int) -> bool:
    try:
        return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                   for c in psutil.net_connections(kind="tcp"))
    except (psutil.AccessDenied, OSError):
        return False


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
