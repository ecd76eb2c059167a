"""The one exception root of the package, and the exit codes the CLI maps them to.

Exit codes mean the same everywhere: 0 ok, 1 a check or a job failed, 2 usage or
configuration error, 3 the environment is missing something (a Slurm package, a
device), 4 Slurm (or another external service) failed or timed out.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_EXTERNAL = 4


class HPResilienceError(Exception):
    """Root of every error this package raises on purpose."""

    exit_code = EXIT_FAILED


class ConfigError(HPResilienceError):
    """A configuration file, a rule or an argument is wrong; the message names what and where."""

    exit_code = EXIT_USAGE


class EnvironmentMissing(HPResilienceError):
    """Something the machine must provide is absent (a package, a binary, a device)."""

    exit_code = EXIT_ENVIRONMENT


class ExternalError(HPResilienceError):
    """An external command or service failed."""

    exit_code = EXIT_EXTERNAL


class SlurmError(ExternalError):
    """A Slurm command failed; carries the command, its exit code and its stderr."""

    def __init__(
        self, argv: list[str] | tuple[str, ...], returncode: int | None, stderr: str, message: str | None = None
    ) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        cmd = " ".join(self.argv)
        if message is None:
            last = self.stderr.splitlines()[-1] if self.stderr else "no error output"
            message = f"`{cmd}` exited {returncode}: {last}"
        super().__init__(message)


class SlurmTimeout(SlurmError):
    """A Slurm command did not finish within its timeout (its process group was killed)."""

    def __init__(self, argv: list[str] | tuple[str, ...], timeout: float, stderr: str = "") -> None:
        cmd = " ".join(argv)
        super().__init__(argv, None, stderr, f"`{cmd}` timed out after {timeout:g} s (slurmctld not answering?)")
        self.timeout = timeout


class SlurmParseError(SlurmError):
    """A Slurm command answered with output we cannot read."""


class UnknownNode(SlurmError):
    """A node name Slurm does not know: most often a typo on the command line, so a usage error (exit 2)."""

    exit_code = EXIT_USAGE


class JobFailed(HPResilienceError):
    """A supervised job ended without success; `exit_code` is the job's own."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# The optional dependencies of pyproject.toml, by the top-level module a missing one shows as. The node
# side's modules are in a training environment (`pip install hpresilience[torch]`) only if someone put them there.
EXTRA_OF_MODULE = {
    "re2": "node",
    "psutil": "node",
    "pynvml": "node",
    "prometheus_client": "node",
    "boto3": "node",
    "botocore": "node",
    "hostlist": "node",
    "torch": "torch",
    "numpy": "torch",
    "xxhash": "torch",
}


class MissingExtra(EnvironmentMissing):
    """A command needs an optional extra that is not installed: one line naming the extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"this needs the '{extra}' extra (no module named {module!r}): pip install 'hpresilience[{extra}]'"
        )
        self.module = module
        self.extra = extra


def missing_extra(err: ModuleNotFoundError) -> MissingExtra | None:
    """The MissingExtra an import failure means, or None when the missing module is no extra's."""
    top = (err.name or "").partition(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    return None if extra is None else MissingExtra(top, extra)
