"""Operations on jobs beyond SlurmClient's: details only the text form shows, the comment, and the requeue
marker that lets the controller start a requeued job without Slurm's hold."""

from __future__ import annotations

from dataclasses import dataclass

from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.parse import parse_oneliner

log = get_logger("hpresilience.slurm")
# What srun --auto-resume adds to its job's comment before it requeues the job (a comment survives a
# requeue): the controller, as root, starts such a job at once instead of after Slurm's requeue hold.
REQUEUE_MARKER = "hpr:requeued"


def job_details(client: SlurmClient, job_id: int) -> dict[str, str]:
    """`scontrol show job -o J` as key/values (SubmitTime, Comment, BatchHost, ...); {} when unreadable.
    The JSON readers leave out the submit time and the comment, which only this wrapper needs."""
    res = client.runner.run("scontrol", "show", "job", "-o", str(job_id), check=False, retry=False)
    if res.returncode != 0:
        log.warning("job_details_unreadable", job_id=job_id, error=res.stderr.strip()[:200])
        return {}
    return parse_oneliner(res.stdout)


def set_job_comment(client: SlurmClient, job_id: int, comment: str) -> None:
    """`scontrol update jobid=J Comment=...` (the job's owner may do it; it survives a requeue). Not retried:
    without slurmdbd a resized job refuses every update for good ("DB index is being set")."""
    client.runner.run("scontrol", "update", f"jobid={job_id}", f"Comment={comment}", retry=False)


def with_requeue_marker(comment: str, present: bool) -> str:
    """The user's comment with our marker added or taken off; the rest of it is kept as it was."""
    words = [w for w in comment.split() if w != REQUEUE_MARKER]
    return " ".join([*words, REQUEUE_MARKER] if present else words)


@dataclass(frozen=True)
class HeldJob:
    job_id: int
    reason: str
    comment: str


def requeued_jobs_held(client: SlurmClient) -> list[HeldJob]:
    """Pending jobs whose comment carries REQUEUE_MARKER (text squeue: unlike --json it honours -t)."""
    res = client.runner.run("squeue", "-h", "-t", "PD", "-o", "%i|%r|%k", retry=False)
    held = []
    for line in res.stdout.splitlines():
        job, _, rest = line.strip().partition("|")
        reason, _, comment = rest.partition("|")
        # Only jobs under the hold: any other pending reason is the scheduler's business, not a requeue's.
        if job.isdigit() and reason == "BeginTime" and REQUEUE_MARKER in comment.split():
            held.append(HeldJob(int(job), reason, comment))
    return held


def release_requeued_job(client: SlurmClient, job: HeldJob) -> None:
    """Start a requeued job now rather than after Slurm's hold (cred_expire + 1 s, two minutes by
    default; the hold shows as Reason=BeginTime), and take the marker off its comment. Root only."""
    client.runner.run("scontrol", "update", f"jobid={job.job_id}", "StartTime=now", retry=False)
    client.runner.run("scontrol", "update", f"jobid={job.job_id}",
                      f"Comment={with_requeue_marker(job.comment, False)}", retry=False)
