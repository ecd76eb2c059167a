"""Slurm operations the srun --auto-resume wrapper needs beyond SlurmClient: its job's steps."""

from __future__ import annotations

from dataclasses import dataclass

from hpresilience.errors import SlurmError, SlurmTimeout
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.parse import parse_step_lines

log = get_logger("hpresilience.slurm")


@dataclass(frozen=True)
class StepInfo:
    step_id: str  # "12.3"
    name: str
    nodes: tuple[str, ...]


def job_steps(client: SlurmClient, job_id: int) -> list[StepInfo]:
    """The job's live steps (`squeue -s`; unlike `squeue --json`, the text form honours -j)."""
    res = client.runner.run("squeue", "-s", "-j", str(job_id), "-h", "-o", "%i|%j|%N", check=False)
    if res.returncode != 0:
        # A job that has ended answers "Invalid job id": it has no steps left.
        if "Invalid job id" in res.stderr:
            return []
        raise SlurmError(list(res.argv), res.returncode, res.stderr)
    return [StepInfo(step_id, name, nodes) for step_id, name, nodes in parse_step_lines(res.stdout)]


def named_steps(client: SlurmClient, job_id: int, name: str) -> list[StepInfo]:
    return [s for s in job_steps(client, job_id) if s.name == name]


def signal_step(client: SlurmClient, step_id: str, signal: str | None = None, timeout: float = 5.0) -> None:
    """`scancel [--signal=SIG] J.S`: with a signal, only the tasks get it; without, the step is cancelled.
    Bounded: scancel waits for every node of the step to answer, and a dead node never does."""
    args = ([f"--signal={signal}"] if signal else []) + [step_id]
    try:
        client.runner.run("scancel", *args, retry=False, check=False, timeout=timeout)
    except SlurmTimeout:
        log.warning("step_signal_timed_out", step=step_id, signal=signal, timeout_s=timeout)
        return
    log.info("step_signalled" if signal else "step_cancelled", step=step_id, signal=signal)
