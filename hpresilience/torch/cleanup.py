"""Memory-tier housekeeping that needs no torch: which job a namespace belongs to, removing a crashed
job's tier (the Slurm epilog), and the job's cgroup memory headroom (checked before the first save).

The epilog runs as root on a path the job's user controls: the user (from another job, at the same
moment) can swap any folder of theirs on it for a link, and can make any name of theirs a FIFO. So the
tier root is opened once, without following a link in its last part, and judged on the open descriptor
(a folder owned by the job's user and closed to others); from then on every scan, read and removal is
relative to descriptors (`dir_fd`), never through a path again. Each namespace is opened the same way,
its `.job` read only if it is a regular file of that user (non-blocking, at most 64 bytes), and the
removal descends only into folders owned by the job's user, follows no link and goes at most
`MAX_DEPTH` levels deep: root removes nothing the user could not have removed, whatever the user swaps
in meanwhile. What a link earlier on the root's path leads to is not trusted either: it only matters
through the folder finally opened, judged as above.

A tier root another user made (`mkdir /dev/shm/hpresilience-<your uid>` squats the name: its owner may
keep it forever and every save of yours fails) is removed too, but only where no user can change what
the root's path names (every folder from `/` to its parent root's own, writable by no one else unless
sticky, links root's own): then the name is the victim's by construction. The removal descends only
into the squatter's own folders; the empty root is then made again for the job's user (0700), so the
name cannot be squatted again before the user's next job.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from hpresilience.log import get_logger

log = get_logger("hpresilience.torch")

JOB_FILE = ".job"
DEFAULT_ROOT = "/dev/shm/hpresilience-{uid}"
MAX_DEPTH = 32  # the tier is 4 levels deep (ns/peer/src/step); deeper is not ours to follow
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC


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
    squatter_uid: int | None = None  # set when the folder was another user's squat on the tier root


def _root_only(st: os.stat_result) -> bool:
    """A folder only root can change the entries of (sticky: others add theirs but cannot replace root's)."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and (not st.st_mode & 0o022 or bool(st.st_mode & 0o1000))


def open_root_only(path: str, max_links: int = 40) -> int | None:
    """A descriptor of folder `path` if no user but root can change what it names (see the module doc),
    else None. Walks from `/` one name at a time without following links but root's own."""
    parts = deque(p for p in path.split("/") if p not in ("", "."))
    fd = os.open("/", _DIR)
    try:
        if not _root_only(os.fstat(fd)):
            return None
        while parts:
            name = parts.popleft()
            if name == "..":
                return None  # not worth resolving: a tier pattern has no reason to hold one
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                max_links -= 1
                if st.st_uid != 0 or max_links < 0:
                    return None
                target = os.readlink(name, dir_fd=fd)
                parts.extendleft(reversed([p for p in target.split("/") if p not in ("", ".")]))
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR)
                continue
            nfd = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if not _root_only(os.fstat(fd)):
                return None
        out, fd = fd, -1
        return out
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _empty(dfd: int, owner: int, depth: int = 0) -> tuple[int, int]:
    """Remove what folder `dfd` holds, descending only into folders `owner` owns (opened without following a
    link, judged on the descriptor). Returns (bytes freed, entries left behind)."""
    freed = kept = 0
    for name in os.listdir(dfd):
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=dfd)  # a link is removed, never followed; the folder is owner's
                freed += st.st_blocks * 512 if stat.S_ISREG(st.st_mode) else 0
                continue
            if depth >= MAX_DEPTH:
                kept += 1
                continue
            cfd = os.open(name, _DIR, dir_fd=dfd)
            try:
                cst = os.fstat(cfd)
                if cst.st_uid != owner:
                    kept += 1  # another user's folder: root does not empty what the owner could not
                    continue
                f, k = _empty(cfd, owner, depth + 1)
            finally:
                os.close(cfd)
            freed, kept = freed + f, kept + k
            if not k and _same(os.stat(name, dir_fd=dfd, follow_symlinks=False), cst):
                os.rmdir(name, dir_fd=dfd)
        except FileNotFoundError:
            continue
        except OSError as err:  # a link swapped in (ELOOP), a folder refilled meanwhile: leave it
            kept += 1
            log.debug("checkpoint_tier_entry_left", name=name, error=str(err))
    return freed, kept


def _remove(pfd: int, name: str, fd: int, st: os.stat_result, owner: int) -> tuple[int, bool]:
    """Empty folder `fd` (entry `name` of `pfd`) as `owner` could, then remove it if it is still that
    entry. Returns (bytes freed, whether the folder is gone)."""
    freed, kept = _empty(fd, owner)
    if kept:
        return freed, False
    try:
        if not _same(os.stat(name, dir_fd=pfd, follow_symlinks=False), st):
            return freed, False
        os.rmdir(name, dir_fd=pfd)
    except OSError:
        return freed, False
    return freed, True


def _read_job(nfd: int, uid: int) -> str:
    """The namespace's `.job`, if it is a regular file of `uid` closed to others ("" otherwise); never
    blocks (a FIFO there) and reads at most 64 bytes."""
    try:
        fd = os.open(JOB_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=nfd)
    except OSError:
        return ""  # no job file: not written under Slurm, or not ours to judge
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or not _private_of(fst, uid):
            return ""
        return os.read(fd, 64).decode(errors="replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)


def _job_namespaces(rfd: int, root: Path, job_id: str, uid: int) -> list[Removed]:
    removed: list[Removed] = []
    for name in os.listdir(rfd):
        try:
            nfd = os.open(name, _DIR, dir_fd=rfd)
        except OSError:
            continue  # not a folder, or a link: not a namespace
        try:
            nst = os.fstat(nfd)
            if nst.st_uid != uid or _read_job(nfd, uid) != job_id:
                continue
            held, gone = _remove(rfd, name, nfd, nst, uid)
        finally:
            os.close(nfd)
        ns = str(root / name)
        if gone:
            removed.append(Removed(ns, held))
            log.info("checkpoint_tier_removed", folder=ns, job_id=job_id, bytes=held)
        else:
            log.warning("checkpoint_tier_partly_removed", folder=ns, job_id=job_id, bytes=held)
    return removed


def _claims(root_pattern: str) -> bool:
    """Whether the root's own name carries the uid, so that a root of another owner squats that user's."""
    return "{uid}" in Path(root_pattern).name


def _evict(pfd: int, root: Path, rfd: int, rst: os.stat_result, uid: int, gid: int) -> list[Removed]:
    """Remove a squatter's tier root and make it again, empty, for `uid`."""
    held, gone = _remove(pfd, root.name, rfd, rst, rst.st_uid)
    if not gone:
        log.warning("checkpoint_tier_squat_left", root=str(root), squatter_uid=rst.st_uid, bytes=held)
        return []
    log.warning("checkpoint_tier_squat_removed", root=str(root), squatter_uid=rst.st_uid, uid=uid, bytes=held)
    try:
        os.mkdir(root.name, 0o700, dir_fd=pfd)
        fd = os.open(root.name, _DIR, dir_fd=pfd)
        try:
            if os.fstat(fd).st_uid == 0:  # the folder we just made, not one raced in
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    except OSError as err:  # the user's next save makes it anyway
        log.info("checkpoint_tier_root_not_made", root=str(root), error=str(err))
    return [Removed(str(root), held, squatter_uid=rst.st_uid)]


def remove_job_tiers(job_id: str, uid: int, root_pattern: str = DEFAULT_ROOT, gid: int = -1) -> list[Removed]:
    """Remove every namespace under the user's memory-tier root written by Slurm job `job_id`, or the
    root itself if another user squats it (see the module doc). `gid`: the group a re-made root gets."""
    root = Path(os.path.abspath(root_pattern.replace("{uid}", str(uid))))  # the walk below starts at /
    trusted = open_root_only(str(root.parent))
    try:
        # A parent only the user controls may lead anywhere: what it leads to is judged below.
        pfd = trusted if trusted is not None else os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        try:
            rfd = os.open(root.name, _DIR, dir_fd=pfd)
        except FileNotFoundError:
            return []
        except OSError as err:  # a link (ELOOP), not a folder (ENOTDIR)
            log.warning("checkpoint_tier_root_refused", root=str(root), reason=f"not a plain folder: {err}")
            return []
        try:
            rst = os.fstat(rfd)
            if _private_of(rst, uid):
                return _job_namespaces(rfd, root, job_id, uid)
            if rst.st_uid not in (uid, 0) and trusted is not None and _claims(root_pattern):
                return _evict(pfd, root, rfd, rst, uid, gid)
            log.warning(
                "checkpoint_tier_root_refused",
                root=str(root),
                owner=rst.st_uid,
                reason="not a private folder of the job's user",
            )
            return []
        finally:
            os.close(rfd)
    finally:
        os.close(pfd)


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
