"""Memory-tier files only this user can have written: private folders, no links followed, no adoption.

/dev/shm is shared by every user of a node and the tier's paths are predictable, so nothing found there
is trusted unless it belongs to this user and nobody else could have changed it. That is checked on the
open descriptor (no race between check and use), and `.metadata` is unpickled only after such a check.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hpresilience.errors import ConfigError


class TierSecurityError(ConfigError):
    """A memory-tier folder or file that another user could have made or changed."""


def _refuse_unless_private(st: os.stat_result, what: str, path: Path, tier_root: bool = False) -> None:
    me = os.geteuid()
    if st.st_uid != me and tier_root:
        # A root named for our uid in a shared folder (/dev/shm) that someone else made first: we cannot
        # remove it (sticky folder), and saying "remove it" would send the user nowhere.
        who = "root made it" if st.st_uid == 0 else "another user squats the name"
        fix = (
            "Ask"
            if st.st_uid == 0
            else "The hpresilience Slurm epilog (`hpresilience install --role compute`) removes it when a job "
            "of yours ends on this node; otherwise ask"
        )
        raise TierSecurityError(
            f"checkpoint memory tier root {path} was made by uid {st.st_uid}, not by you (uid {me}): {who}, "
            f"and only they or root can remove it. {fix} an administrator to remove {path}. Meanwhile "
            "set another memory_dir (e.g. memory_dir='/dev/shm/hpresilience-{uid}-2')."
        )
    if st.st_uid != me:
        raise TierSecurityError(
            f"checkpoint memory tier {what} {path} belongs to uid {st.st_uid}, not to you (uid {me}): "
            "another user may have planted it. Remove it or choose another memory_dir."
        )
    if st.st_mode & 0o022:
        raise TierSecurityError(
            f"checkpoint memory tier {what} {path} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): anyone could plant files in it. Remove it or chmod 700."
        )


def ensure_private_dir(path: Path, tier_root: bool = False) -> None:
    """Create `path` as 0700, or accept an existing one only if it is ours, a real folder and closed.
    `tier_root`: `path` is the user's memory-tier root, whose name others can squat (said in the error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise TierSecurityError(f"checkpoint memory tier folder {path} is not a plain folder (a link?)")
    _refuse_unless_private(st, "folder", path, tier_root)


def open_private(path: Path, flags: int, *, reuse: bool = False) -> int:
    """Open a tier file for writing without following links and without adopting another's file.

    A new file is made with O_EXCL (mode 0600). `reuse` accepts an existing regular file of ours (a
    recycled spare); anything else at the path is removed first.
    """
    base = flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    if reuse:
        try:
            fd = os.open(path, base)
        except FileNotFoundError:
            pass
        except OSError:  # a link (ELOOP) or something else odd: replace it below
            path.unlink(missing_ok=True)
        else:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                return fd
            os.close(fd)
            path.unlink(missing_ok=True)
    else:
        path.unlink(missing_ok=True)
    return os.open(path, base | os.O_CREAT | os.O_EXCL, 0o600)


def open_trusted(path: Path) -> int:
    """Open a tier file for reading only if it is a regular file of ours that nobody else may change."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TierSecurityError(f"checkpoint file {path} is not a regular file")
        _refuse_unless_private(st, "file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_trusted(path: Path) -> bytes:
    """The bytes of a file written by this user (checked on the open descriptor, so no race)."""
    fd = open_trusted(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def expand_root(root: str) -> str:
    """`{uid}` in a memory_dir becomes the user's uid: each user gets a root of their own."""
    return root.replace("{uid}", str(os.geteuid()))
