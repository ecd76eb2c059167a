"""External commands for checks: every one in its own process group, killed as a group on timeout.

The runner also kills the groups a check started when the check as a whole runs out of time: a
check registers its children in the tracker bound to its thread, so a hung `nvidia-smi` or a
`stress-ng` that ignores SIGTERM never outlives the check that started it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass

_local = threading.local()


class ProcessTracker:
    """The process groups one check run has started and not yet reaped."""

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


def bind_tracker(tracker: ProcessTracker | None) -> None:
    _local.tracker = tracker


def current_tracker() -> ProcessTracker | None:
    t: ProcessTracker | None = getattr(_local, "tracker", None)
    return t


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int | None  # None: killed after the timeout
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        cmd = " ".join(self.argv)
        if self.timed_out:
            return f"`{cmd}` timed out"
        last = (self.stderr.strip() or self.stdout.strip()).splitlines()[-1:] or ["no output"]
        return f"`{cmd}` exited {self.returncode}: {last[0][:200]}"


def resolve(tool: str) -> str | None:
    """The executable for a configured tool: a path is used if it exists, a bare name is looked up on PATH."""
    if os.sep in tool:
        return tool if os.access(tool, os.X_OK) else None
    return shutil.which(tool)


def run_command(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> CommandResult:
    """Run a command to completion or kill its whole process group after `timeout` seconds."""
    tracker = current_tracker()
    if tracker is not None and tracker.cancelled:
        return CommandResult(tuple(argv), None, "", "check cancelled", timed_out=True)
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,
        env={**os.environ, **env} if env else None,
    )
    if tracker is not None:
        tracker.add(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
        return CommandResult(tuple(argv), proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        return CommandResult(tuple(argv), None, out, err, timed_out=True)
    finally:
        # The leader exited; children it left in the group must not linger either.
        kill_group(proc.pid)
        if tracker is not None:
            tracker.discard(proc.pid)
