"""A devcluster node's CPU share (`devcluster slow NODE --cpu FRACTION`): one cgroup per node in the cpu controller.

Every node's slurmd starts inside a cgroup of its own, `hpr<port>-<node>` in the cpu controller's hierarchy
(cgroup v1: /sys/fs/cgroup/cpu/..., v2: /sys/fs/cgroup/...), joined by a tiny prefix before slurmd is executed
(`join_prefix`). Whatever slurmd starts afterwards (its slurmstepds, job scripts, tasks) is born there: a child
starts in its parent's cgroup, and neither Slurm (proctrack/cgroup uses the freezer hierarchy; the devcluster's
cgroup.conf constrains nothing) nor the host-mode nodes' shared process table moves it elsewhere. A quota on that one
cgroup then slows the node as a whole, daemons and training ranks alike, as a slow host would be; nothing of the
other nodes is touched. The quota stays across a restart of the node's slurmd (the cgroup outlives it) and goes
with `--cpu 1` or the cluster's `down`.

The command building and the hierarchy's detection are pure functions (unit-tested); only `prepare`, `set_quota`
and `remove_all` touch the filesystem.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from hpresilience.errors import ConfigError, EnvironmentMissing
from hpresilience.log import get_logger

log = get_logger("hpresilience.devcluster")

PERIOD_US = 100_000  # the kernel's default CFS period
MIN_FRACTION = 0.01  # cgroup v1 refuses a quota under 1 ms per period
# Joins the cgroup whose cgroup.procs is argv[1], then becomes argv[2:]: the process keeps its pid, so slurmd (and
# what it forks) is inside from its first instruction. cgroup.procs takes a pid in v1 and v2 alike. A join the
# kernel refuses (a delegated v2 tree) leaves the node unconfined, not unstarted: `set_quota` then says so.
_JOIN = """import os,sys
try:
    with open(sys.argv[1], 'w') as f:
        f.write(str(os.getpid()))
except OSError as e:
    print('nodecpu: not in', sys.argv[1], e, file=sys.stderr)
os.execvp(sys.argv[2], sys.argv[2:])
"""


@dataclass(frozen=True)
class CpuHierarchy:
    """Where the cpu controller is mounted: version 1 (its own hierarchy) or 2 (the unified one)."""

    version: int
    mount: Path


def find_hierarchy(mounts: str) -> CpuHierarchy | None:
    """The cpu controller's hierarchy from a mount table (/proc/self/mounts); None when it has none. A v1 mount
    with the `cpu` option wins: on a hybrid host the unified hierarchy is mounted too, without that controller."""
    v2: Path | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        target, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup" and "cpu" in options:
            return CpuHierarchy(1, Path(target.replace("\\040", " ")))
        if fstype == "cgroup2" and v2 is None:
            v2 = Path(target.replace("\\040", " "))
    return CpuHierarchy(2, v2) if v2 is not None else None


def cgroup_name(base_port: int, node: str) -> str:
    return f"hpr{base_port}-{node}"  # the netns names' pattern: a cluster's own, found by its base port


def quota_files(version: int, fraction: float, period_us: int = PERIOD_US) -> list[tuple[str, str]]:
    """(file, value) writes, in order, that give a cgroup `fraction` of one CPU; a fraction of 1 or more removes
    the quota. Raises ConfigError for a fraction the kernel cannot give."""
    check_fraction(fraction)
    unlimited = fraction >= 1.0
    quota = round(fraction * period_us)
    if version == 1:
        # The period first: v1 checks a new quota against the period in force.
        return [("cpu.cfs_period_us", str(period_us)), ("cpu.cfs_quota_us", "-1" if unlimited else str(quota))]
    return [("cpu.max", f"{'max' if unlimited else quota} {period_us}")]


def check_fraction(fraction: float) -> None:
    if not fraction >= MIN_FRACTION:  # also NaN
        raise ConfigError(
            f"--cpu must be a fraction of one CPU from {MIN_FRACTION} to 1 (1 removes it), not {fraction:g}"
        )


def read_fraction(version: int, files: dict[str, str]) -> float | None:
    """The quota the cgroup's files say, as a fraction of one CPU; None when it has none."""
    if version == 1:
        quota, period = files.get("cpu.cfs_quota_us", "-1").strip(), files.get("cpu.cfs_period_us", "0").strip()
    else:
        quota, _, period = files.get("cpu.max", "max").strip().partition(" ")
    if quota in ("-1", "max") or not period.isdigit() or int(period) == 0 or not quota.isdigit():
        return None
    return int(quota) / int(period)


def join_argv(procs_file: Path) -> list[str]:
    """argv prefix that runs what follows it inside the cgroup whose cgroup.procs is `procs_file`."""
    return [sys.executable, "-I", "-S", "-c", _JOIN, str(procs_file)]


def hierarchy() -> CpuHierarchy | None:
    """This host's cpu hierarchy, where this process may create cgroups in it (root); None otherwise."""
    try:
        found = find_hierarchy(Path("/proc/self/mounts").read_text())
    except OSError:
        return None
    if found is None or not os.access(found.mount, os.W_OK):
        return None
    if found.version == 2 and "cpu" not in _read(found.mount / "cgroup.controllers").split():
        return None
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def prepare(base_port: int, node: str) -> list[str]:
    """Create the node's cgroup (where the host has a writable cpu hierarchy) and return the prefix that starts a
    command inside it; [] where there is none (the node then runs unconfined, and `slow --cpu` says why)."""
    h = hierarchy()
    if h is None:
        return []
    d = h.mount / cgroup_name(base_port, node)
    try:
        if h.version == 2 and "cpu" not in _read(h.mount / "cgroup.subtree_control").split():
            (h.mount / "cgroup.subtree_control").write_text("+cpu")
        d.mkdir(exist_ok=True)
    except OSError as e:
        log.warning("devcluster_cpu_cgroup_unavailable", node=node, path=str(d), error=str(e))
        return []
    return join_argv(d / "cgroup.procs")


def set_quota(base_port: int, node: str, fraction: float) -> None:
    """Give the node `fraction` of one CPU (1 removes the quota). Raises EnvironmentMissing where the host has
    no writable cpu controller, ConfigError where the node's slurmd was not started in its cgroup."""
    check_fraction(fraction)
    h = hierarchy()
    if h is None:
        raise EnvironmentMissing(
            "no writable cpu cgroup controller here (cgroup v1 `cpu` or v2 with `cpu` in cgroup.controllers, as "
            "root): a node's CPU cannot be limited"
        )
    d = h.mount / cgroup_name(base_port, node)
    if not _read(d / "cgroup.procs").split():
        raise ConfigError(
            f"node {node!r} has no process in its cpu cgroup {d}: its slurmd was started outside it (restart the "
            "cluster; where the kernel refused the join, its log says `nodecpu: not in`)"
        )
    for name, value in quota_files(h.version, fraction):
        try:
            (d / name).write_text(value)
        except OSError as e:
            raise ConfigError(f"cannot write {value!r} to {d / name}: {e}") from e


def quota(base_port: int, node: str) -> float | None:
    """The node's CPU quota as a fraction of one CPU (None: unlimited, or no cgroup)."""
    h = hierarchy()
    if h is None:
        return None
    d = h.mount / cgroup_name(base_port, node)
    names = ("cpu.cfs_quota_us", "cpu.cfs_period_us") if h.version == 1 else ("cpu.max",)
    return read_fraction(h.version, {n: _read(d / n) for n in names})


def remove_all(base_port: int) -> list[str]:
    """Remove the cluster's node cgroups (its processes are stopped already); those still holding a process stay
    (logged) for the next `down` on this port."""
    h = hierarchy()
    if h is None:
        return []
    removed: list[str] = []
    for d in h.mount.glob(f"{cgroup_name(base_port, '')}*"):
        with contextlib.suppress(OSError):
            if d.is_dir():
                try:
                    d.rmdir()
                    removed.append(d.name)
                except OSError as e:
                    log.warning("devcluster_cpu_cgroup_busy", path=str(d), error=str(e))
    return removed
