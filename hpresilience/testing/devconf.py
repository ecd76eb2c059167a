"""What a devcluster is made of: its slurm.conf and cgroup.conf, and the Slurm programs it runs.

Everything lives in the cluster's state directory, nothing is written to /etc. The node table is given as
(name, address, port) rows: the addresses are the isolation mode's (isolation.py), the rest is the same for all.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpresilience.errors import ConfigError, EnvironmentMissing
from hpresilience.slurm.hostlist import compress
from hpresilience.testing import slurmroot
from hpresilience.testing.slurmroot import SlurmRelease

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("scontrol", "sinfo", "squeue", "srun", "sbatch", "salloc", "scancel")
APT_HINT = "apt-get install -y slurm-wlm  (Debian packages slurmctld, slurmd and slurm-client)"
PROCTRACK = ("auto", "cgroup", "pgid")
CGROUP_V1_FREEZER = Path("/sys/fs/cgroup/freezer")
# The production-size table: powered-down p5-like nodes (State=CLOUD) that slurmctld serves but never starts.
EXTRA_NODE_PREFIX = "gpu-st-p5-"
EXTRA_PARTITION = "p5"
TASK_PROLOG = "taskprolog.sh"


def node_names(count: int) -> list[str]:
    return [f"n{i}" for i in range(1, count + 1)]


def check_proctrack(proctrack: str) -> None:
    if proctrack not in PROCTRACK:
        raise ConfigError(f"unknown proctrack {proctrack!r}; known: {', '.join(PROCTRACK)}")


def resolve_proctrack(proctrack: str) -> str:
    """cgroup where Slurm 22.05 can use it here (cgroup v1 freezer mounted and writable), else pgid."""
    if proctrack != "auto":
        return proctrack
    return "cgroup" if cgroup_v1_usable() else "pgid"


def cgroup_v1_usable() -> bool:
    """Slurm 22.05's proctrack/cgroup needs the v1 freezer hierarchy, writable (as root)."""
    try:
        return (CGROUP_V1_FREEZER / "cgroup.procs").exists() and os.access(CGROUP_V1_FREEZER, os.W_OK)
    except OSError:
        return False


def settings(
    state_dir: Path,
    base_port: int,
    controller: str,
    proctrack: str,
    *,
    shared_state: bool,
    accounting: Mapping[str, str] | None,
    extra_nodes: int,
    overrides: Mapping[str, str],
    release: SlurmRelease = SlurmRelease.HOST,
    task_prolog: bool = False,
) -> dict[str, str]:
    """slurm.conf's key=value lines. controller: the first SlurmctldHost; shared_state: a backup controller reads
    the state the primary saved; accounting: slurmdbd's lines (None: no accounting); release: what it runs;
    task_prolog: the cluster has a TaskProlog (TASK_PROLOG in the state directory, render_task_prolog)."""
    d = state_dir
    s = {
        "ClusterName": "hpdev",
        "SlurmctldHost": controller,
        "SlurmUser": "root",
        "SlurmdUser": "root",
        # Debian's build ships auth/none and cred/none: no munge needed on one machine.
        "AuthType": "auth/none",
        "CredType": "cred/none",
        "ProctrackType": f"proctrack/{proctrack}",
        "TaskPlugin": "task/none",
        # Job ids of clusters running side by side (tests beside a demo) never meet: with proctrack/cgroup
        # every cluster's node n1 shares /sys/fs/cgroup/freezer/slurm_n1/uid_0/job_<id>.
        "FirstJobId": str(base_port * 1000),
        "SelectType": "select/linear",
        "MpiDefault": "none",
        "ReturnToService": "2",
        # The expand-dependency path of growing a job is refused without this.
        "SchedulerParameters": "permit_job_expansion,bf_interval=2",
        "SlurmctldPort": str(base_port),
        "SlurmdPort": str(base_port + 1),
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
    if release is SlurmRelease.V26_05:
        # Slurm's own resilience features, as a site that has them turns them on (slurm/features.py): a job
        # submitted with --requeue=expedite is started again at once when requeued.
        s["SlurmctldParameters"] = "enable_expedited_requeue"
    if task_prolog:
        s["TaskProlog"] = f"{d}/{TASK_PROLOG}"
    if shared_state:  # the backup's slurm.conf differs in its pid and log file only
        s["DebugFlags"] = "NO_CONF_HASH"
    if accounting is not None:
        s.update(accounting)
    if extra_nodes:
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
    s.update({str(k): str(v) for k, v in overrides.items()})
    return s


def render_conf(
    settings: Mapping[str, str], more_controllers: Sequence[str], nodes: Sequence[tuple[str, str, int]], extra: int
) -> str:
    """slurm.conf: the settings, a SlurmctldHost line per further controller, a line per (name, address, port)
    node, the `debug` partition of them, and `extra` powered-down cloud nodes in a partition of their own."""
    lines = ["# Written by `hpresilience devcluster up`; removed by `down`."]
    lines += [f"{k}={v}" for k, v in settings.items()]
    lines += [f"SlurmctldHost={host}" for host in more_controllers]  # a backup, on a host of its own
    for name, addr, port in nodes:
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr={addr} Port={port} CPUs=1 RealMemory=1000 State=UNKNOWN"
        )
    if extra:
        lines.append(
            f"NodeName={EXTRA_NODE_PREFIX}[1-{extra}] NodeHostname=localhost "
            "NodeAddr=127.0.9.1 CPUs=192 Boards=1 SocketsPerBoard=2 CoresPerSocket=48 ThreadsPerCore=2 "
            "RealMemory=2000000 Gres=gpu:8 Features=p5,p5.48xlarge,efa,nvlink Weight=100 State=CLOUD"
        )
    lines.append(
        f"PartitionName=debug Nodes={compress([n for n, _, _ in nodes])} Default=YES MaxTime=INFINITE State=UP"
    )
    if extra:
        lines.append(f"PartitionName={EXTRA_PARTITION} Nodes={EXTRA_NODE_PREFIX}[1-{extra}] MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def render_task_prolog(env: Mapping[str, str]) -> str:
    """The TaskProlog giving every task `env`: slurmstepd runs it before each task and sets the variables of its
    `export NAME=value` lines. A variable the task's own environment has already is kept: the user's choice wins."""
    lines = ["#!/bin/sh", "# Written by `hpresilience devcluster up`."]
    for k, v in sorted(env.items()):
        if not k.isidentifier() or not all(c.isalnum() or c in "._-/" for c in v):
            raise ConfigError(f"task environment {k}={v!r}: a plain name and value only")
        lines.append(f'[ -n "${{{k}:-}}" ] || echo "export {k}={v}"')
    return "\n".join(lines) + "\n"


def render_cgroup_conf() -> str:
    # Only process tracking: constraining cores or memory would fight the other slurmd on this host.
    lines = [
        "# Written by `hpresilience devcluster up`.",
        "CgroupPlugin=cgroup/v1",
        "CgroupAutomount=no",
        "CgroupMountpoint=/sys/fs/cgroup",
        "ConstrainCores=no",
        "ConstrainRAMSpace=no",
        "ConstrainDevices=no",
    ]
    return "\n".join(lines) + "\n"


def needs_root_entry(release: SlurmRelease) -> bool:
    """Whether the release's programs run inside its Debian root, entered from here (not the host's release, and
    this process is not in that root already)."""
    return release.suite is not None and not slurmroot.inside_root()


def slurm_tool(name: str, release: SlurmRelease, bin_dir: str) -> str:
    """The path of a Slurm program as the cluster's daemons see it: inside the release's root where they run
    there, else in bin_dir or on PATH."""
    if needs_root_entry(release):
        root = slurmroot.root_path(release)
        for d in ("/usr/sbin", "/usr/bin"):
            if root is not None and os.path.exists(f"{root}{d}/{name}"):
                return f"{d}/{name}"
        raise EnvironmentMissing(
            f"`{name}` not found in the Slurm {release.value} root {root}; "
            f"rebuild it: rm -r {root} {root}.ready; hpresilience devcluster up "
            f"--slurm {release.value}"
        )
    path = os.path.join(bin_dir, name) if bin_dir else shutil.which(name)
    if not path or not os.path.exists(path):
        raise EnvironmentMissing(f"`{name}` not found; install Slurm: {APT_HINT}")
    return path


def check_installed(release: SlurmRelease, bin_dir: str) -> None:
    """Every daemon and client the cluster runs is there (one message naming all that are missing on the host)."""
    if needs_root_entry(release):
        for tool in (*DAEMONS, *CLIENTS):
            slurm_tool(tool, release, bin_dir)
        return
    missing = [t for t in (*DAEMONS, *CLIENTS) if not (os.path.join(bin_dir, t) if bin_dir else shutil.which(t))]
    if missing:
        raise EnvironmentMissing(f"Slurm commands missing: {', '.join(missing)}; install them: {APT_HINT}")
