"""A devcluster's processes: how they start, which are ours, and how they are stopped.

Daemons are started with the environment marker HPRESILIENCE_DEVCLUSTER=<state dir>, which the slurmstepd
processes they fork do not keep (slurmd starts them with an empty environment): those are known by their working
directory, which is in the cluster's state directory. Whatever either starts (job scripts, tasks) is ours too.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from hpresilience import proc
from hpresilience.errors import ExternalError, HPResilienceError
from hpresilience.slurm.client import SlurmClient

MARKER = "HPRESILIENCE_DEVCLUSTER"
SLURM_DAEMONS = ("slurmctld", "slurmd", "slurmdbd")


class DevclusterError(ExternalError):
    """The local cluster could not be started or stopped; the message carries the daemons' log tail."""


def spawn(argv: list[str], env: dict[str, str], cwd: Path, out: Path | None, log_tail: Callable[[], str]) -> None:
    """Start a daemon. Slurm's daemons fork into the background themselves (the command returns once they did);
    one that stays in front (`out`: the file for its output) is detached into its own session here."""
    if out is not None:
        with open(out, "ab") as f:
            subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=cwd,
            )
        return
    # Slurm's daemons fork and leave the group themselves; nothing left in it may be killed on exit either.
    res = proc.run(argv, 30, env=env, kill_leftovers=False)
    if not res.ok:
        raise DevclusterError(f"{res.describe(tail=300)}\n" + log_tail())


def log_tail(log_dir: Path, lines: int = 15) -> str:
    """The last lines of every daemon log, for an error message."""
    out: list[str] = []
    for f in sorted(log_dir.glob("*.log")) if log_dir.exists() else []:
        tail = f.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {f.name} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(out) or "(no daemon logs yet)"


def _started_with_our_conf(p: psutil.Process, me: str) -> bool:
    """A Slurm daemon started with this cluster's slurm.conf, whatever its environment: one started without our
    marker (seen once: a slurmd n3 that outlived its cluster's `down`) is still the cluster's."""
    return p.name() in SLURM_DAEMONS and any(_under(arg, me) for arg in p.cmdline())


def _answers(check: Callable[[], bool]) -> bool:
    """One way of telling a process is ours; one that cannot read what it needs (a process's environment may be
    refused: AccessDenied) says no, and the next way is tried. Before, that refusal skipped the later checks too,
    the command line naming our slurm.conf among them; a slurmd n3 outlived its cluster's `down` again on
    2026-11-29 (the 26.05 run, found holding its port 17 minutes later)."""
    try:
        return check()
    except (psutil.AccessDenied, OSError):
        return False


def cluster_processes(state_dir: Path) -> list[psutil.Process]:
    """Every live process of the cluster in `state_dir`: the daemons (our marker), the slurmstepds they fork, and
    every descendant of those (job scripts and tasks). This process and its parents are never counted."""
    me = str(state_dir)
    dirs = _dir_ids(state_dir)
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["pid"]):
        checks = (
            lambda p=p: p.environ().get(MARKER) == me,
            lambda p=p: p.name().startswith("slurmstepd") and (_under(p.cwd(), me) or _cwd_id(p.pid) in dirs),
            lambda p=p: _started_with_our_conf(p, me),
        )
        try:
            if any(_answers(check) for check in checks):
                found[p.pid] = p
                for child in p.children(recursive=True):
                    found[child.pid] = child
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    found.pop(os.getpid(), None)
    for parent in psutil.Process().parents():
        found.pop(parent.pid, None)
    return list(found.values())


def pidfile_pid(pidfile: Path, marker: str) -> int | None:
    """The pid a daemon's pid file names, if that process is alive and carries the cluster's marker (a pid file
    left by a crash may name a pid the kernel has since given to another process)."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive_with_marker(pid, marker) else None


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants ([] when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop(procs: list[psutil.Process], grace: float) -> None:
    """SIGTERM every process, SIGKILL those still alive after `grace` seconds, and wait (up to `grace`) for them."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)


def wait_gone(pids: list[int], timeout: float) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=timeout)


def port_listening(port: int) -> bool:
    """Whether a TCP socket of this host's network listens on `port` (any address)."""
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


def wait_jobs_gone(client: SlurmClient, timeout: float) -> None:
    """Until every job the cluster knows has finished, or timeout (before its daemons are stopped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(j.is_finished for j in client.jobs()):
                return
        except HPResilienceError:  # a dying controller: the signals that follow finish its jobs
            return
        time.sleep(0.2)
