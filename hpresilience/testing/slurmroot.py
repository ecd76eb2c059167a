"""Slurm releases the devcluster can run: the host's packages, or a Debian root with a newer Slurm.

Sites run Slurm 23.x-26.x while this machine's Debian 12 ships 22.05. Debian's registry has 24.11 (trixie) and
26.05 (sid), so a newer release runs from a Debian root made with `debootstrap --variant=minbase` plus
`slurm-wlm slurmdbd mariadb-server`, built once and cached outside the checkout
(/var/cache/hpresilience/roots/<suite>, or $HPRESILIENCE_ROOTS_DIR). Commands enter it through rootexec.py:
a private mount namespace with the binds the daemons and our own code need, then chroot.

The host's virtualenv runs inside the root: the interpreter's prefix (sys.base_prefix) is bound at the same
path, and a root's glibc is newer than the host's (2.41 in trixie against 2.36), which runs programs linked
against the older one.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import NoReturn

from hpresilience import proc
from hpresilience.errors import ConfigError, EnvironmentMissing, ExternalError
from hpresilience.log import get_logger
from hpresilience.testing import rootexec

log = get_logger("hpresilience.devcluster")

ROOTS_DIR = Path("/var/cache/hpresilience/roots")
MIRROR = "http://deb.debian.org/debian"
# libffi8, libnsl2, libsqlite3-0, libexpat1: what the virtualenv's interpreter (ctypes, pyexpat; Debian's own
# python3.11 itself) links that minbase lacks. iproute2 (ip, tc): `--isolation netns` makes its namespaces from inside
# the root (mariadb-server pulls it in as well; named so that it stays).
PACKAGES = (
    "slurm-wlm",
    "slurmdbd",
    "mariadb-server",
    "mariadb-client",
    "iproute2",
    "libffi8",
    "libnsl2",
    "libsqlite3-0",
    "libexpat1",
)
RELEASE_FILE = "slurm-release"  # in a cluster's state directory: which release its daemons run
# Inside a root: libraries that replace the root's own for slurmdbd. Slurm 24.11.5's and 26.05.5's slurmdbd cannot
# use the MariaDB Connector/C of trixie and sid (libmariadb3 11.8): its first query fails with "5027 Number of
# columns in result (=1) set execeeds maxmimum allowed number of columns (=0)" and slurmdbd exits; bookworm's
# libmariadb3 (10.11), copied from the host, works.
COMPAT_DIR = "/opt/hpresilience-compat"
HOST_LIBMARIADB = Path("/usr/lib/x86_64-linux-gnu/libmariadb.so.3")


class SlurmRelease(Enum):
    """A Slurm release the devcluster runs, by its Debian suite (None: the host's own packages)."""

    HOST = "22.05"
    V24_11 = "24.11"
    V26_05 = "26.05"

    @property
    def suite(self) -> str | None:
        return {SlurmRelease.HOST: None, SlurmRelease.V24_11: "trixie", SlurmRelease.V26_05: "sid"}[self]

    @property
    def needs_old_libmariadb(self) -> bool:
        return self.suite is not None  # 24.11 on trixie's and 26.05 on sid's libmariadb3 alike

    @classmethod
    def parse(cls, text: str) -> SlurmRelease:
        for r in cls:
            if r.value == text.strip():
                return r
        raise ConfigError(f"unknown Slurm release {text!r}; known: {', '.join(r.value for r in cls)}")


class RootError(ExternalError):
    """A Slurm root could not be built; the message names the step and carries its log tail."""


def roots_dir() -> Path:
    return Path(os.environ.get("HPRESILIENCE_ROOTS_DIR") or ROOTS_DIR)


def root_path(release: SlurmRelease) -> Path | None:
    return roots_dir() / release.suite if release.suite else None


def inside_root() -> str:
    """The root this process runs in ('' on the host)."""
    return os.environ.get(rootexec.INSIDE, "")


def current_release() -> SlurmRelease:
    """The release whose commands this process runs: its root's, or the host's."""
    root = inside_root()
    for r in SlurmRelease:
        if root and r.suite == Path(root).name:
            return r
    return SlurmRelease.HOST


def is_ready(release: SlurmRelease) -> bool:
    path = root_path(release)
    return path is None or (path.parent / f"{path.name}.ready").exists()


# Directories of the root's own system: a bind over one of them would replace the root's Slurm or its libraries.
SYSTEM_DIRS = frozenset({"", "usr", "etc", "var", "bin", "sbin", "lib", "lib64", "proc", "sys", "dev", "run", "boot"})


def is_system_path(path: str) -> bool:
    return Path(path).resolve().parts[1:2] in ((), *((d,) for d in SYSTEM_DIRS))


def interpreter_binds() -> list[str]:
    """What this interpreter needs inside a root. A prefix of its own (pyenv, /opt, /usr/local) is bound whole.
    Debian's /usr/bin/python3.11 cannot be: /usr is the root's. Then the virtualenv must hold a copy of the
    interpreter (`python3 -m venv --copies`, as scripts/dev.sh makes it) and only the standard library is bound."""
    if not is_system_path(sys.base_prefix) or sys.base_prefix.startswith("/usr/local"):
        return [sys.base_prefix]
    exe = os.path.realpath(sys.executable)
    if is_system_path(exe):
        raise EnvironmentMissing(
            f"this virtualenv's python is {exe}, which inside a Slurm root is the root's own "
            f"Python; recreate the virtualenv with `python3 -m venv --copies`"
        )
    return [sysconfig.get_path("stdlib")]


def default_binds(extra: list[str] | None = None) -> list[str]:
    """What must be seen inside a root: /tmp (tests' files and pytest's state), the interpreter, the
    virtualenv and the project checkout (for an editable install), plus the caller's paths. A system directory
    (or /) is never bound: it would hide the root's own."""
    binds = ["/tmp", *interpreter_binds(), sys.prefix, str(Path(__file__).resolve().parents[2])]
    binds += [str(Path(p).resolve()) for p in extra or []]
    out: list[str] = []
    for b in binds:  # a path under another bound one is seen already (/tmp binds recursively)
        allowed = b.startswith(("/usr/lib/python", "/usr/local/")) or not is_system_path(b)
        if allowed and os.path.exists(b) and not any(b == o or b.startswith(o.rstrip("/") + "/") for o in out):
            out.append(b)
    return out


def prefix(release: SlurmRelease, binds: list[str] | None = None) -> list[str]:
    """argv prefix that runs a command inside the release's root ([] for the host release or when already in)."""
    root = root_path(release)
    if root is None or inside_root():
        return []
    if not is_ready(release):
        raise EnvironmentMissing(
            f"the Slurm {release.value} root {root} is not built; "
            f"run: hpresilience devcluster up --slurm {release.value}"
        )
    if os.geteuid() != 0:
        raise EnvironmentMissing(f"running Slurm {release.value} from its root needs root (mount namespaces, chroot)")
    return [sys.executable, "-I", "-S", rootexec.__file__, str(root), *default_binds(binds), "--"]


def ensure(release: SlurmRelease, progress: Callable[[str], None] | None = None) -> Path | None:
    """The release's root, built first when absent (about a minute; progress every few seconds)."""
    root = root_path(release)
    if root is None or is_ready(release):
        return root
    assert release.suite is not None
    if os.geteuid() != 0:
        raise EnvironmentMissing(f"building the Slurm {release.value} root needs root (debootstrap, chroot)")
    if shutil.which("debootstrap") is None:
        raise EnvironmentMissing("`debootstrap` not found: apt-get install -y debootstrap")
    partial = root.parent / f"{root.name}.partial"
    logfile = root.parent / f"{root.name}.build.log"
    root.parent.mkdir(parents=True, exist_ok=True)
    if partial.exists():
        shutil.rmtree(partial)
    started = time.monotonic()
    _step(
        ["debootstrap", "--variant=minbase", release.suite, str(partial), MIRROR],
        f"debootstrap {release.suite}",
        logfile,
        900,
        progress,
    )
    for name in ("etc/hosts", "etc/resolv.conf"):
        shutil.copyfile(f"/{name}", partial / name)
    # Never start a daemon while installing (mariadb-server would start a system mysqld in the root).
    rc = partial / "usr/sbin/policy-rc.d"
    rc.write_text("#!/bin/sh\nexit 101\n")
    rc.chmod(0o755)
    env_argv = ["env", "DEBIAN_FRONTEND=noninteractive", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    into = [sys.executable, "-I", "-S", rootexec.__file__, str(partial), "--", *env_argv]
    # sid's Release file carries a Valid-Until that a mirror snapshot can be past.
    _step(
        [*into, "apt-get", "-q", "-o", "Acquire::Check-Valid-Until=false", "update"],
        "apt-get update",
        logfile,
        600,
        progress,
    )
    _step(
        [*into, "apt-get", "-q", "-y", "-o", "Dpkg::Use-Pty=0", "install", "--no-install-recommends", *PACKAGES],
        f"installing {' '.join(PACKAGES)}",
        logfile,
        900,
        progress,
    )
    _step([*into, "apt-get", "clean"], "apt-get clean", logfile, 60, progress)
    if release.needs_old_libmariadb:
        if not HOST_LIBMARIADB.exists():
            raise EnvironmentMissing(
                f"{HOST_LIBMARIADB} not found (Slurm {release.value}'s slurmdbd needs bookworm's "
                "MariaDB client library): apt-get install -y libmariadb3"
            )
        compat = partial / COMPAT_DIR.lstrip("/")
        compat.mkdir(parents=True, exist_ok=True)
        shutil.copy2(HOST_LIBMARIADB, compat / HOST_LIBMARIADB.name)
    partial.rename(root)
    (root.parent / f"{root.name}.ready").write_text(f"{release.value}\n")
    took = time.monotonic() - started
    log.info("slurm_root_built", release=release.value, suite=release.suite, root=str(root), seconds=round(took, 1))
    if progress is not None:
        progress(f"Slurm {release.value} root ready in {took:.0f} s: {root}")
    return root


def _step(argv: list[str], what: str, logfile: Path, timeout: float, progress: Callable[[str], None] | None) -> None:
    """Run one build step with its output appended to the build log; report progress every 5 s."""
    result: list[proc.Result] = []
    with open(logfile, "a+b") as out:
        out.write(f"\n### {what}: {' '.join(argv)}\n".encode())
        out.flush()
        worker = threading.Thread(target=lambda: result.append(proc.run(argv, timeout, output=out)), daemon=True)
        started = time.monotonic()
        if progress is not None:
            progress(f"{what} (log: {logfile})")
        worker.start()
        while worker.is_alive():
            worker.join(5.0)
            if worker.is_alive() and progress is not None:
                progress(f"{what}: {time.monotonic() - started:.0f} s so far; {_last_line(logfile)}")
    if not result or not result[0].ok:
        detail = result[0].describe(tail=600) if result else "the step did not finish"
        raise RootError(f"building the Slurm root failed at {what}: {detail}\n(full log: {logfile})")


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 400))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:120] if lines else ""
    except OSError:
        return ""


def session_prefix(release: SlurmRelease, pid: int, cwd: str) -> list[str]:
    """argv prefix that runs a command in the mount namespace and root of a process already running in the
    release's root ([] for the host release or when already inside). A netns cluster in a root has its named
    network namespaces mounted in the mount namespace its `up` made (/run/netns there): a fresh rootexec.py would
    see only their empty files on the host. cwd stays where it is when that namespace sees it, else /."""
    root = root_path(release)
    if root is None or inside_root():
        return []
    wd = cwd if os.path.isdir(f"/proc/{pid}/root{cwd}") else "/"
    return ["nsenter", f"--target={pid}", "--mount", "--root", f"--wd={wd}", "env", f"{rootexec.INSIDE}={root}"]


def exec_in(
    release: SlurmRelease,
    argv: list[str],
    env: dict[str, str] | None = None,
    binds: list[str] | None = None,
    session: int | None = None,
) -> NoReturn:
    """Replace this process with argv run inside the release's root (directly for the host release or when
    already inside). Used by the CLI: `devcluster exec`, and any devcluster command on a newer release.
    session: the pid of a live daemon whose mount namespace the command joins (session_prefix)."""
    where = prefix(release, binds) if session is None else session_prefix(release, session, os.getcwd())
    full = [*where, *argv]
    try:
        os.execvpe(full[0], full, env if env is not None else dict(os.environ))
    except OSError as e:
        raise EnvironmentMissing(f"cannot run {argv[0]}: {e}") from None
