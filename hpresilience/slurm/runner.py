"""Running Slurm's commands: the one place that starts them.

Every command goes through the process seam (hpresilience.proc): no shell, an absolute timeout, and on
expiry its whole process group is killed (srun/salloc fork helpers that would otherwise linger). Here a
timeout becomes SlurmTimeout, and a failure a SlurmError carrying the command, its exit code and its stderr.
Transient refusals are retried with backoff.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from hpresilience import proc
from hpresilience.errors import EnvironmentMissing, SlurmError, SlurmTimeout
from hpresilience.log import get_logger
from hpresilience.proc import Result

__all__ = ["APT_PACKAGES", "FINAL", "TRANSIENT", "CommandRunner", "CountingRunner", "Result", "run_once", "start"]

log = get_logger("hpresilience.slurm")

# slurmctld answers these while it is busy or restarting: worth a retry.
TRANSIENT = re.compile(
    r"try again|Socket timed out|Unable to contact slurm controller|Zero Bytes were transmitted"
    r"|Connection refused|Resource temporarily unavailable|slurmctld not responding|Communication connection failure"
    r"|Transport endpoint is not connected",
    re.IGNORECASE,
)
# ...except this one, which says "try again" too but never clears for the job it names: with
# accounting_storage/none every update of a job after its first resize, and with slurmdbd every update of a
# job whose resize met an unreachable slurmdbd, is refused so (after 5 s inside slurmctld) until it ends or
# is requeued. Retrying it only spends slurmctld's time: it is final at once.
FINAL = re.compile(r"DB index is being set", re.IGNORECASE)

APT_PACKAGES = {
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "srun": "slurm-client",
    "salloc": "slurm-client",
    "sbatch": "slurm-client",
    "scancel": "slurm-client",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
}


def start(
    argv: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    input_text: str | None = None,
) -> Result:
    """One run through the process seam; a timed-out result is returned, not raised. A missing tool names
    the package that brings it."""
    try:
        return proc.run(argv, timeout, env=env, cwd=cwd, input_text=input_text)
    except EnvironmentMissing:
        tool = os.path.basename(argv[0])
        pkg = APT_PACKAGES.get(tool, "slurm-wlm")
        raise EnvironmentMissing(f"`{tool}` not found: apt-get install -y slurm-wlm (or {pkg})") from None


def run_once(
    argv: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    input_text: str | None = None,
) -> Result:
    """Run argv once; its process group is killed and SlurmTimeout raised after `timeout` seconds."""
    res = start(argv, timeout, env, cwd, input_text)
    if res.timed_out:
        raise SlurmTimeout(list(argv), timeout, res.stderr)
    return res


class CommandRunner:
    """Finds and runs Slurm commands with a fixed environment, timeout and retry policy."""

    def __init__(
        self,
        bin_dir: str = "",
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.bin_dir = bin_dir
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.env = dict(env) if env is not None else None

    def path_of(self, tool: str) -> str:
        if self.bin_dir:
            return os.path.join(self.bin_dir, tool)
        path = (self.env or os.environ).get("PATH")
        return shutil.which(tool, path=path) or tool

    def execute(
        self, argv: list[str], timeout: float, env: Mapping[str, str], cwd: str | None, input_text: str | None
    ) -> Result:
        """One attempt at the process seam (a timeout is a result with `timed_out`): the one method a fake
        runner replaces (hpresilience/testing/fakerunner.py), so retries and errors stay this class's."""
        return start(argv, timeout, env, cwd, input_text)

    def run(
        self,
        tool: str,
        *args: str,
        timeout: float | None = None,
        check: bool = True,
        retry: bool = True,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        input_text: str | None = None,
        unset: Collection[str] = (),
    ) -> Result:
        """Run `tool args...` (`env` added to the runner's environment, `unset` taken out of it); retry transient
        refusals with exponential backoff, then raise SlurmError."""
        argv = [self.path_of(tool), *args]
        run_env = dict(self.env if self.env is not None else os.environ)
        if env:
            run_env.update(env)
        for name in unset:
            run_env.pop(name, None)
        limit = timeout if timeout is not None else self.timeout
        attempts = 1 + (self.retries if retry else 0)
        started = time.monotonic()
        delay = self.backoff
        for attempt in range(1, attempts + 1):
            res = self.execute(argv, limit, run_env, cwd, input_text)
            if res.timed_out:
                if attempt >= attempts:
                    raise SlurmTimeout(argv, limit, res.stderr)
                log.warning(
                    "slurm_command_timed_out",
                    command=" ".join(argv),
                    attempt=attempt,
                    waited_s=round(time.monotonic() - started, 1),
                )
            else:
                if res.returncode == 0 or not check:
                    return res
                said = res.stderr + res.stdout
                if attempt >= attempts or not TRANSIENT.search(said) or FINAL.search(said):
                    raise SlurmError(argv, res.returncode, res.stderr or res.stdout)
                log.info(
                    "slurm_command_retrying",
                    command=" ".join(argv),
                    attempt=attempt,
                    reason=(res.stderr.strip().splitlines() or [""])[-1][:200],
                    waited_s=round(time.monotonic() - started, 1),
                )
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
        raise AssertionError("unreachable")


class CountingRunner(CommandRunner):
    """A CommandRunner that keeps every result it returned: what benches and tests count Slurm's work by."""

    def __init__(
        self,
        bin_dir: str = "",
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(bin_dir, timeout, retries, backoff, env)
        self.calls: list[Result] = []

    @classmethod
    def like(cls, runner: CommandRunner) -> CountingRunner:
        return cls(runner.bin_dir, runner.timeout, runner.retries, runner.backoff, runner.env)

    def run(self, tool: str, *args: str, **kwargs: Any) -> Result:
        res = super().run(tool, *args, **kwargs)
        self.calls.append(res)
        return res

    @property
    def bytes_read(self) -> int:
        return sum(len(r.stdout) + len(r.stderr) for r in self.calls)

    def commands(self) -> list[str]:
        """Each call as `tool arg...` with the tool's directory left out."""
        return [" ".join([os.path.basename(r.argv[0]), *r.argv[1:]]) for r in self.calls]
