"""Running external commands: the one process seam every part starts its commands through.

No shell. Each command runs in a session (and so a process group) of its own, under an absolute timeout;
on expiry the whole group is killed with SIGKILL, so the helpers it forked (srun's, a shell's background
jobs, a `stress-ng` that ignores SIGTERM) die with it. By default the group is killed again once the command
exits, so nothing it started outlives it; a caller whose command may leave a daemon on purpose (ssh's
ControlPersist master behind a site script) says `kill_leftovers=False`.

A command started for a health check also dies when the process that started it dies (Linux's parent-death
signal, SIGKILL): its own session puts it out of reach of whoever kills ours by group. slurmd ends a
HealthCheckProgram that overruns with SIGKILL to the program's process group; the stress-ng the check had
started then loaded the whole node until its own --timeout, while the node could take a job. Only those (the
commands started while a ProcessTracker is bound, below): the signal is set between fork and exec, which makes
Python fork where it would vfork, 36 ms per command for a 400 MB process against 1.4 ms (measured here: the
wrapper and the tests run Slurm's commands by the thousand), and a controller's re-imaging script must outlive
a controller that dies mid-call. The signal is the starting thread's (the kernel's rule): `run` and
`background` wait in the thread that started the command, so it outlives the command.

A timeout is not an exception here: the result says `timed_out`, and each caller turns that into its own
error (the Slurm runner's SlurmTimeout, a check's `unknown`). A command that cannot be started at all is
EnvironmentMissing (not installed) or ExternalError (not executable).

Work that starts commands on someone's behalf (a health check) can bind a ProcessTracker to its thread:
every group started through `run` or `background` is registered there while alive, and `kill_all` ends them
all and refuses further starts, when the work as a whole runs out of time.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hpresilience.errors import EnvironmentMissing, ExternalError

# What a command that writes to a file hands back as its stdout: the end of what it wrote.
OUTPUT_TAIL = 2000
# After the group is killed, how long to wait for the pipes to drain: a process that left the group
# (setsid) may still hold them open, and must not hold the caller forever.
_DRAIN_S = 5.0


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    duration_s: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self, tail: int = 0) -> str:
        """`cmd` exited N: its last line of output (stderr first); with `tail`, its last `tail` characters
        instead, for tools whose cause sits a few lines above the end (mariadb-install-db, slurmctld)."""
        cmd = " ".join(self.argv)
        if self.timed_out:
            return f"`{cmd}` timed out"
        out = self.stderr.strip() or self.stdout.strip()
        what = out[-tail:] if tail else (out.splitlines()[-1:] or [""])[0][:200]
        return f"`{cmd}` exited {self.returncode}: {what or 'no output'}"


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the group; a group that is already gone (or no longer ours) is no error."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ProcessTracker:
    """The process groups one unit of work (a check run) has started and not yet reaped."""

    def __init__(self) -> None:
        self._pgids: set[int] = set()
        self._lock = threading.Lock()
        self.cancelled = False

    def add(self, pgid: int) -> None:
        with self._lock:
            self._pgids.add(pgid)

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._pgids.discard(pgid)

    def kill_all(self) -> list[int]:
        with self._lock:
            pgids, self._pgids = sorted(self._pgids), set()
            self.cancelled = True
        for pgid in pgids:
            kill_group(pgid)
        return pgids


_local = threading.local()


def bind_tracker(tracker: ProcessTracker | None) -> None:
    _local.tracker = tracker


def current_tracker() -> ProcessTracker | None:
    t: ProcessTracker | None = getattr(_local, "tracker", None)
    return t


def _register(tracker: ProcessTracker | None, pgid: int) -> None:
    if tracker is not None:
        tracker.add(pgid)
        if tracker.cancelled:  # kill_all ran between the start and the add: it did not see this group
            kill_group(pgid)


def resolve(tool: str) -> str | None:
    """The executable for a configured tool: a path is used if it exists, a bare name is looked up on PATH."""
    if os.sep in tool:
        return tool if os.access(tool, os.X_OK) else None
    return shutil.which(tool)


def _linux_prctl() -> Callable[..., int] | None:
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal, the group kill still holds
        return None
    return fn


_PRCTL = _linux_prctl()  # resolved here: the child, between fork and exec, must not load anything
_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> Callable[[], None] | None:
    """What the child runs before exec: SIGKILL to it when the thread that started it is gone; if the parent died
    before the signal was set (a fork then a kill), it ends itself at once rather than run unowned."""
    prctl = _PRCTL
    if prctl is None:
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def _popen(
    argv: list[str],
    env: dict[str, str] | None,
    cwd: str | Path | None,
    stdin: int,
    stdout: int | IO[bytes],
    stderr: int,
    die_with_caller: bool,
) -> subprocess.Popen[bytes]:
    if not argv:
        raise ExternalError("cannot run an empty command")
    try:
        # preexec_fn is unsafe in a threaded parent when the hook takes a lock; this one calls one C function,
        # resolved at import, and nothing else.
        return subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with(os.getpid()) if die_with_caller else None,
        )
    except FileNotFoundError as err:
        if cwd is not None and str(err.filename) == str(cwd):
            raise ExternalError(f"cannot run {argv[0]!r}: no directory {str(cwd)!r}") from None
        raise EnvironmentMissing(f"cannot run {argv[0]!r}: not found") from None
    except OSError as err:  # EACCES, ENOEXEC: there, but not something we can execute
        raise ExternalError(f"cannot run {argv[0]!r}: {err.strerror or err}") from None


def _env(env: Mapping[str, str] | None, extra_env: Mapping[str, str] | None) -> dict[str, str] | None:
    if env is None and not extra_env:
        return None
    return {**(env if env is not None else os.environ), **(extra_env or {})}


def run(
    argv: Sequence[str],
    timeout: float,
    *,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    input_text: str | None = None,
    output: Path | IO[bytes] | None = None,
    kill_leftovers: bool = True,
) -> Result:
    """Run `argv` to completion, or kill its process group `timeout` seconds after it started.

    `env` replaces the environment (None: this process's), `extra_env` is laid over it. Output is captured
    from pipes into `stdout` and `stderr`; with `output` (a path, or a binary file open for writing) both
    streams go to that file instead, and `stdout` holds the last OUTPUT_TAIL characters written there.
    """
    args = [str(a) for a in argv]
    tracker = current_tracker()
    if tracker is not None and tracker.cancelled:
        return Result(tuple(args), None, "", "cancelled", 0.0, timed_out=True)
    if isinstance(output, Path):
        with open(output, "w+b") as f:
            return _run(args, timeout, _env(env, extra_env), cwd, input_text, f, kill_leftovers, tracker)
    return _run(args, timeout, _env(env, extra_env), cwd, input_text, output, kill_leftovers, tracker)


def _run(
    argv: list[str],
    timeout: float,
    env: dict[str, str] | None,
    cwd: str | Path | None,
    input_text: str | None,
    output: IO[bytes] | None,
    kill_leftovers: bool,
    tracker: ProcessTracker | None,
) -> Result:
    start_offset = output.seek(0, os.SEEK_END) if output is not None else 0
    started = time.monotonic()
    proc = _popen(
        argv,
        env,
        cwd,
        subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        output if output is not None else subprocess.PIPE,
        subprocess.STDOUT if output is not None else subprocess.PIPE,
        die_with_caller=tracker is not None,
    )
    _register(tracker, proc.pid)
    data = input_text.encode() if input_text is not None else None
    timed_out = False
    try:
        try:
            out, err = proc.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc.pid)
            try:
                out, err = proc.communicate(timeout=_DRAIN_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                out, err = b"", b""
    finally:
        # `poll() is None`: the wait itself was interrupted (KeyboardInterrupt): the command must not outlive it.
        if kill_leftovers or timed_out or proc.poll() is None:
            kill_group(proc.pid)
        if tracker is not None:
            tracker.discard(proc.pid)
    duration = time.monotonic() - started
    if output is not None:
        stdout, stderr = _tail(output, start_offset), ""
    else:
        stdout, stderr = _text(out), _text(err)
    return Result(tuple(argv), None if timed_out else proc.returncode, stdout, stderr, duration, timed_out)


def _text(data: bytes | None) -> str:
    # What `text=True` would give: UTF-8 with bad bytes replaced, universal newlines.
    return (data or b"").decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _tail(f: IO[bytes], start: int) -> str:
    f.flush()
    size = f.seek(0, os.SEEK_END)
    f.seek(max(start, size - OUTPUT_TAIL * 4))
    return f.read().decode(errors="replace")[-OUTPUT_TAIL:]


@contextmanager
def background(argv: Sequence[str], *, extra_env: Mapping[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A command running beside the caller's work (a loopback test's server), its output discarded; its whole
    group is killed and reaped when the block ends, however it ends."""
    tracker = current_tracker()
    proc = _popen(
        [str(a) for a in argv],
        _env(None, extra_env),
        None,
        subprocess.DEVNULL,
        subprocess.DEVNULL,
        subprocess.DEVNULL,
        die_with_caller=tracker is not None,
    )
    _register(tracker, proc.pid)
    try:
        yield proc
    finally:
        kill_group(proc.pid)
        proc.wait()
        if tracker is not None:
            tracker.discard(proc.pid)
