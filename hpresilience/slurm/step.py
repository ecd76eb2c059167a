"""Launching and signalling one long-running `srun` job step.

The runner (runner.py) is for short commands whose output it captures under a timeout; a training step
runs for hours and its output must stream to the user as it comes. So the step is a child of its own
session (a signal meant for the wrapper's terminal never reaches it twice), with both streams piped to
the caller, who reads them in threads.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import IO

from hpresilience.errors import EnvironmentMissing
from hpresilience.log import get_logger

log = get_logger("hpresilience.slurm")


def srun_path(bin_dir: str = "", env: Mapping[str, str] | None = None) -> str:
    if bin_dir:
        return os.path.join(bin_dir, "srun")
    found = shutil.which("srun", path=(env or os.environ).get("PATH"))
    if not found:
        raise EnvironmentMissing("`srun` not found: apt-get install -y slurm-client (or set slurm.bin_dir)")
    return found


class StepProcess:
    """One `srun` process; `signal()` reaches srun itself, which forwards most signals to the tasks."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> None:
        self.argv = list(argv)
        try:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=dict(env), cwd=cwd, start_new_session=True)
        except FileNotFoundError:
            raise EnvironmentMissing(f"cannot start `{self.argv[0]}`: not found") from None
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stdout(self) -> IO[bytes]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    @property
    def stderr(self) -> IO[bytes]:
        assert self.proc.stderr is not None
        return self.proc.stderr

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status, or None if still running after `timeout` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill_group(self) -> None:
        """SIGKILL srun and whatever it forked; the remote tasks are the step's cancel's business."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
