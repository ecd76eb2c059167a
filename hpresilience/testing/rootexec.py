"""Run one command inside a Slurm root (a Debian tree with another Slurm release), in a mount namespace of its own.

    python -I -S rootexec.py ROOT BIND... -- ARGV...

The devcluster starts its daemons and `devcluster exec` its commands through this file. It takes a private
mount namespace (so nothing here is seen from the host, and everything vanishes with the last process that
uses it), binds ROOT onto itself (a chroot whose / is a mount point: `ip -n` needs one), mounts /proc, binds
/dev, /sys and the host's /run/netns recursively (slurmd 24.11 starts its cgroup plugin even with
proctrack/pgid and dies on a plain /sys bind: "No filesystem mounted on /sys/fs/cgroup"), binds each BIND
path at the same path inside ROOT (the cluster's state directory, the project checkout and its virtualenv,
the interpreter's prefix, /tmp), then chroots and executes ARGV with this environment.

It runs as `python -I -S` on a path, importing only the standard library, so that starting a daemon costs
one interpreter start and no package import. Python 3.11 has no os.unshare: libc's is called through ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
# Marks a process (and what it starts) as running inside a root: the devcluster then runs Slurm natively.
INSIDE = "HPRESILIENCE_SLURM_ROOT"
NETNS_DIR = "/run/netns"

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    rc = _libc.mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        None,
    )
    _check(rc, f"mount {source or fstype} on {target}")


def _bind(root: str, path: str) -> None:
    target = root + path
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "a"):
            pass
    _mount(path, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REC | MS_SLAVE)


def enter(root: str, binds: list[str]) -> None:
    """Private mount namespace, the mounts, chroot; the caller then executes its command."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted below leaks to the host
    # The root a mount point of its own: `ip -n NS` (iproute2) remounts / as a slave in its own mount namespace,
    # which the kernel refuses (EINVAL) on a chroot whose / is a plain directory.
    _mount(root, root, None, MS_BIND | MS_REC)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # The host's named network namespaces: a netns devcluster inside the root (`--isolation netns --slurm 24.11`)
    # adds its own there, so that the host's `ip netns list` sees them too (its guard route stays while they live).
    os.makedirs(NETNS_DIR, exist_ok=True)
    for path in ("/dev", "/sys", NETNS_DIR):
        _bind(root, path)
    for path in binds:
        _bind(root, os.path.realpath(path))
    cwd = os.getcwd()
    os.chroot(root)
    os.chdir(cwd if os.path.isdir(cwd) else "/")


def main(args: list[str]) -> int:
    if "--" not in args or len(args) < 3:
        print("usage: rootexec.py ROOT [BIND...] -- ARGV...", file=sys.stderr)
        return 2
    sep = args.index("--")
    root, binds, argv = args[0].rstrip("/"), args[1:sep], args[sep + 1 :]
    if not argv:
        print("rootexec.py: no command after --", file=sys.stderr)
        return 2
    try:
        enter(root, binds)
        env = dict(os.environ)
        env[INSIDE] = root
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        print(f"rootexec.py: {argv[0]}: {e}", file=sys.stderr)
        return 127
    return 0  # not reached: execvpe replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
