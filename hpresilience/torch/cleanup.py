"""Memory-tier housekeeping that needs no torch: which job a namespace belongs to, removing a crashed
job's tier (the Slurm epilog), and the job's cgroup memory headroom (checked before the first save).

The epilog runs as root in a folder users control, so it trusts nothing it finds: the root must be a
real folder owned by the job's user and closed to others, each namespace a real folder, the job file a
regular file of that user read without following links; the removal itself never follows a link
(shutil.rmtree on open descriptors).
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from hpresilience.log import get_logger

log = get_logger("hpresilience.torch")

JOB_FILE = ".job"
DEFAULT_ROOT = "/dev/shm/hpresilience-{uid}"


def job_file_text() -> str | None:
    """What a namespace records about the Slurm job that writes it (None outside Slurm)."""
    job = os.environ.get("SLURM_JOB_ID", "").strip()
    return job if job.isdigit() else None


def _private_of(st: os.stat_result, uid: int) -> bool:
    return st.st_uid == uid and not st.st_mode & 0o022


@dataclass(frozen=True)
class Removed:
    folder: str
    bytes: int


def _size(d: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(d):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total


def remove_job_tiers(job_id: str, uid: int, root_pattern: str = DEFAULT_ROOT) -> list[Removed]:
    """Remove every namespace under the user's memory-tier root written by Slurm job `job_id`."""
    root = Path(root_pattern.replace("{uid}", str(uid)))
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode) or not _private_of(st, uid):
        log.warning("checkpoint_tier_root_refused", root=str(root), reason="not a private folder of the job's user")
        return []
    removed: list[Removed] = []
    for entry in os.scandir(root):
        if not entry.is_dir(follow_symlinks=False):
            continue
        ns = Path(entry.path)
        try:
            fd = os.open(ns / JOB_FILE, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # no job file: not written under Slurm, or not ours to judge
        try:
            fst = os.fstat(fd)
            owner = stat.S_ISREG(fst.st_mode) and _private_of(fst, uid)
            text = os.read(fd, 64).decode(errors="replace").strip() if owner else ""
        finally:
            os.close(fd)
        if text != job_id:
            continue
        held = _size(ns)
        shutil.rmtree(ns, ignore_errors=True)
        removed.append(Removed(str(ns), held))
        log.info("checkpoint_tier_removed", folder=str(ns), job_id=job_id, bytes=held)
    return removed


@dataclass(frozen=True)
class Headroom:
    """The tightest memory limit above this process in its cgroup tree."""

    cgroup: str
    limit: int
    usage: int
    reclaimable: int

    @property
    def free(self) -> int:
        return self.limit - self.usage + self.reclaimable


def _read_int(p: Path) -> int | None:
    try:
        text = p.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat_field(p: Path, *names: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in p.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k in names and v.strip().isdigit():
                out[k] = int(v)
    except OSError:
        pass
    return out


def cgroup_headroom(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> Headroom | None:
    """Memory left under the tightest limit from this process's cgroup up (v2, or v1's memory
    controller); None when no limit applies or nothing can be read. Page cache counts as free (the
    kernel reclaims it); tmpfs pages do not (they are charged and cannot be reclaimed but by deleting)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    best: Headroom | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, rel = parts
        v2 = hid == "0" and controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        base = Path(root) if v2 else Path(root) / "memory"
        names = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        d = base / rel.lstrip("/")
        while True:
            limit, usage = _read_int(d / names[0]), _read_int(d / names[1])
            if limit is not None and usage is not None and limit < (1 << 60):
                st = _stat_field(d / "memory.stat", "file", "shmem", "total_cache", "total_shmem")
                cache = st.get("file", st.get("total_cache", 0)) - st.get("shmem", st.get("total_shmem", 0))
                h = Headroom(str(d), limit, usage, max(0, cache))
                if best is None or h.free < best.free:
                    best = h
            if d == base or base not in d.parents:
                break
            d = d.parent
    return best
