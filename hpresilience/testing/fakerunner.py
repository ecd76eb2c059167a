"""A fake command runner for cheap client-level tests: `SlurmClient(FakeRunner().answer(...))`.

It replaces only the process seam of CommandRunner (`execute`): no process starts, the scripted answer comes
back as the same Result a real command would give, and everything above the seam is production code (the
retries of transient refusals, SlurmError and SlurmTimeout with the command, exit code and stderr). So a test
through it sees exactly the errors a caller would see against a real slurmctld, without one.

    runner = FakeRunner(version="23.11.4")
    runner.answer("squeue", "-s", stdout="42.0|train|n[1-2]\\n")
    runner.answer("scontrol", "--json", "show", "node", exit_code=1, stderr="Invalid node name specified")
    runner.answer("scancel", timeout=True)
    client = SlurmClient(runner)

An answer matches a command by argv prefix (tool name, then arguments); the longest matching prefix wins.
Several answers for one prefix are given out in order, the last one repeating (a refusal, then success). A
command without an answer fails the test with the command named.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hpresilience.slurm.runner import CommandRunner, Result


@dataclass(frozen=True)
class Answer:
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    timeout: bool = False  # the command hangs until its timeout: the runner sees its group killed


@dataclass(frozen=True)
class Call:
    """One command as the runner would have started it (tool name without its directory)."""

    argv: tuple[str, ...]
    timeout: float
    env: Mapping[str, str]
    cwd: str | None
    input_text: str | None

    def __str__(self) -> str:
        return " ".join(self.argv)


class NoAnswer(AssertionError):
    """The code under test ran a command the test did not script."""


class FakeRunner(CommandRunner):
    def __init__(self, version: str | None = "23.11.4", retries: int = 4, timeout: float = 30.0) -> None:
        # No backoff: retries happen as in production, without the waiting.
        super().__init__(bin_dir="", timeout=timeout, retries=retries, backoff=0.0, env={})
        self._answers: dict[tuple[str, ...], list[Answer]] = {}
        self.calls: list[Call] = []
        if version is not None:
            self.answer("scontrol", "--version", stdout=f"slurm {version}\n")

    def answer(
        self, *prefix: str, stdout: str = "", stderr: str = "", exit_code: int = 0, timeout: bool = False
    ) -> FakeRunner:
        """Script the answer to commands starting with `prefix`; returns self, so answers chain."""
        if not prefix:
            raise ValueError("an answer needs at least the tool's name")
        self._answers.setdefault(tuple(prefix), []).append(Answer(stdout, stderr, exit_code, timeout))
        return self

    def path_of(self, tool: str) -> str:
        return tool

    def execute(
        self, argv: list[str], timeout: float, env: Mapping[str, str], cwd: str | None, input_text: str | None
    ) -> Result:
        args = (os.path.basename(argv[0]), *argv[1:])
        self.calls.append(Call(args, timeout, dict(env), cwd, input_text))
        matches = [p for p in self._answers if args[: len(p)] == p]
        if not matches:
            raise NoAnswer(f"FakeRunner has no answer for `{' '.join(args)}`")
        queue = self._answers[max(matches, key=len)]
        ans = queue.pop(0) if len(queue) > 1 else queue[0]
        if ans.timeout:
            return Result(tuple(argv), None, "", ans.stderr, timeout, timed_out=True)
        return Result(tuple(argv), ans.exit_code, ans.stdout, ans.stderr, 0.0)

    def commands(self) -> list[str]:
        """Each command run, as `tool arg...`."""
        return [str(c) for c in self.calls]
