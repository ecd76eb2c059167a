"""The `slurm:` section of the configuration: how Slurm's commands are found and run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpresilience.settings_base import Section


class SlurmSettings(Section):
    """How Slurm's commands are found and run."""

    # Directory holding scontrol/sinfo/squeue/srun/salloc; empty means look on PATH.
    bin_dir: str = ""
    # Every command is killed (with its process group) after this many seconds.
    command_timeout_s: float = Field(default=30.0, gt=0)
    # Transient refusals ("try again in a bit", slurmctld not answering) are retried with backoff.
    retries: int = Field(default=4, ge=0, le=20)
    retry_backoff_s: float = Field(default=0.5, gt=0)
    # How Slurm is reached. Only "commands" (scontrol/sinfo/squeue) exists: "auto" (pyslurm) was once accepted
    # and silently ignored, so it is now refused rather than promise what does not run.
    backend: Literal["commands"] = "commands"
