"""Launching and signalling one long-running `srun` job step, and reading srun's error lines.

The runner (runner.py) is for short commands whose output it captures under a timeout; a training step
runs for hours and its output must stream to the user as it comes. So this is the one Popen outside the
process seam (hpresilience.proc), sharing only its group kill: the step is a child of its own
session (a signal meant for the wrapper's terminal never reaches it twice), with both streams piped to
the caller, who reads them in threads.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import IO

from hpresilience.errors import EnvironmentMissing, SlurmParseError
from hpresilience.log import get_logger
from hpresilience.proc import kill_group
from hpresilience.slurm.hostlist import expand

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
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
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
        kill_group(self.proc.pid)


# srun's own words when a node of the step is lost (srun/libsrun, 22.05 through 25.x).
NODE_FAILURE_LINE = re.compile(
    r"^srun: error: (?:Node failure on (?P<node>[\w.\-\[\],]+)"
    r"|Task launch for StepId=\S+ failed on node (?P<node2>[\w.\-]+)"
    r"|(?P<node3>[\w.\-]+): tasks? [\d,\-]+: Unknown error)",
    re.MULTILINE,
)
# srun's line for each task that ended badly: "n2: task 1: Exited with exit code 3", "n1: task 0: Terminated".
TASK_END_LINE = re.compile(r"^srun: error: [\w.\-]+: tasks? [\d,\-]+: (?P<what>.*)$", re.MULTILINE)
TASK_EXITED = re.compile(r"^Exited with exit code (?P<code>\d+)")


def nodes_from_srun_errors(lines: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for line in lines:
        for m in NODE_FAILURE_LINE.finditer(line):
            name = m.group("node") or m.group("node2") or m.group("node3")
            if not name:
                continue
            # srun names several lost nodes as one hostlist ("Node failure on n[2-3]").
            try:
                found.update(expand(name))
            except SlurmParseError:
                log.warning("srun_node_list_unreadable", nodes=name[:200])
    return found


def application_exit_code(exit_code: int, srun_errors: Iterable[str]) -> int:
    """The step's exit code as the application set it.

    srun exits with the highest code over its tasks, a signal counting as 128+signal. When one task exits
    3, srun (--kill-on-bad-exit) terminates the others, and their 143 hides the 3 that caused it, and with
    it noRetryExitCodes. So when srun's code is a signal's and the first task srun reports ended by
    exiting, that task's code is the step's.
    """
    if exit_code <= 128:
        return exit_code
    first = next((m.group("what") for line in srun_errors for m in TASK_END_LINE.finditer(line)), None)
    exited = TASK_EXITED.match(first) if first is not None else None
    return int(exited.group("code")) if exited and int(exited.group("code")) else exit_code


# srun prefixes its own complaints so; they are kept apart from the tasks' output for the classifier.
SRUN_ERROR_PREFIX = "srun: error:"
# `srun --label` puts "<task id>: " (padded) before every line of a task's output.
_TASK_LABEL = re.compile(r"^ *\d+: ", re.MULTILINE)


def srun_error_lines(text: str) -> list[str]:
    """srun's own error lines in a block of the step's output."""
    if SRUN_ERROR_PREFIX not in text:
        return []
    return [ln for ln in text.splitlines() if ln.startswith(SRUN_ERROR_PREFIX)]


def strip_task_labels(text: str) -> str:
    """A block of `srun --label` output without the task labels, as the task printed it."""
    return _TASK_LABEL.sub("", text)
