"""Operations on jobs beyond SlurmClient's: details only the text form shows, the comment, and the requeue
marker that lets the controller start a requeued job without Slurm's hold."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from hpresilience.errors import SlurmError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.parse import parse_oneliner

log = get_logger("hpresilience.slurm")
# What srun --auto-resume adds to its job's comment before it requeues the job (a comment survives a
# requeue): the controller, as root, starts such a job at once instead of after Slurm's requeue hold.
REQUEUE_MARKER = "hpr:requeued"
# squeue prints an empty comment as this.
_NULL = "(null)"
# A word of a comment, with the whitespace before it (so taking the marker off keeps every other byte).
_MARKER_WORD = re.compile(r"(^|\s)" + re.escape(REQUEUE_MARKER) + r"(?=\s|$)")
# The identity read at wrapper start is retried this many times over about IDENTITY_READ_S seconds.
IDENTITY_READ_TRIES = 5
IDENTITY_READ_S = 10.0


def job_details(client: SlurmClient, job_id: int) -> dict[str, str]:
    """`scontrol show job -o J` as key/values (SubmitTime, BatchHost, ...); {} when unreadable.
    The JSON readers leave out the submit time, which only this wrapper needs. The comment is NOT read from
    here: the one-line form prints it unquoted, so a comment holding `k=v` words is cut (use job_comment)."""
    res = client.runner.run("scontrol", "show", "job", "-o", str(job_id), check=False, retry=False)
    if res.returncode != 0:
        log.warning("job_details_unreadable", job_id=job_id, error=res.stderr.strip()[:200])
        return {}
    return parse_oneliner(res.stdout)


def job_identity_details(
    client: SlurmClient, job_id: int, tries: int = IDENTITY_READ_TRIES, within_s: float = IDENTITY_READ_S
) -> dict[str, str]:
    """job_details, retried (a transient slurmctld error at wrapper start must not leave the job without its
    identity): up to `tries` reads spread over about `within_s` seconds; {} if none gave a SubmitTime."""
    delay = within_s / max(1, 2 ** (tries - 1) - 1) if tries > 1 else 0.0
    for attempt in range(1, tries + 1):
        details = job_details(client, job_id)
        if details.get("SubmitTime"):
            return details
        if attempt < tries:
            log.info("job_identity_retrying", job_id=job_id, attempt=attempt)
            time.sleep(delay)
            delay *= 2
    return {}


def job_comment(client: SlurmClient, job_id: int) -> str:
    """The job's comment byte for byte (`squeue -h -j J -o %k`: the comment field alone, a one-job query).
    A failed read raises (SlurmError): a caller about to write the comment back must not write a guess."""
    res = client.runner.run("squeue", "-h", "-j", str(job_id), "-o", "%k")
    text = res.stdout.removesuffix("\n")
    if "\n" in text:
        raise SlurmError(list(res.argv), res.returncode, res.stderr, f"squeue printed several lines for job {job_id}")
    return "" if text == _NULL else text


def set_job_comment(client: SlurmClient, job_id: int, comment: str) -> None:
    """`scontrol update jobid=J Comment=...` (the job's owner may do it; it survives a requeue). Not retried:
    without slurmdbd a resized job refuses every update for good ("DB index is being set")."""
    client.runner.run("scontrol", "update", f"jobid={job_id}", f"Comment={comment}", retry=False)


def with_requeue_marker(comment: str, present: bool) -> str:
    """The user's comment with our marker added (as " hpr:requeued" at its end) or taken off; every other
    byte of it is kept as it was (spaces, `k=v` words, tabs)."""
    if present:
        if has_requeue_marker(comment):
            return comment
        return f"{comment} {REQUEUE_MARKER}" if comment else REQUEUE_MARKER
    if comment == REQUEUE_MARKER:
        return ""
    if comment.endswith(f" {REQUEUE_MARKER}"):
        return comment[: -len(REQUEUE_MARKER) - 1]
    m = _MARKER_WORD.search(comment)
    if m is None:
        return comment
    if m.group(1):  # inside: drop the marker and the one separator before it
        return comment[: m.start()] + comment[m.end() :]
    return comment[m.end() + 1 :]  # first word: drop it and the one separator after it


def has_requeue_marker(comment: str) -> bool:
    return _MARKER_WORD.search(comment) is not None


@dataclass(frozen=True)
class HeldJob:
    job_id: int
    reason: str
    comment: str


def parse_held(text: str) -> list[HeldJob]:
    """`squeue -h -o %i|%r|%k` lines: the pending jobs under Slurm's requeue hold whose comment has the marker."""
    held = []
    for line in text.splitlines():
        job, _, rest = line.partition("|")
        reason, _, comment = rest.partition("|")
        comment = "" if comment == _NULL else comment
        # Only jobs under the hold: any other pending reason is the scheduler's business, not a requeue's.
        if job.strip().isdigit() and reason == "BeginTime" and has_requeue_marker(comment):
            held.append(HeldJob(int(job), reason, comment))
    return held


def requeued_jobs_held(client: SlurmClient) -> list[HeldJob]:
    """Pending jobs whose comment carries REQUEUE_MARKER (text squeue: unlike --json it honours -t).
    This reads the whole pending queue (its cost grows with the queue): see held_among for the jobs known."""
    res = client.runner.run("squeue", "-h", "-t", "PD", "-o", "%i|%r|%k", retry=False)
    return parse_held(res.stdout)


def held_among(client: SlurmClient, job_ids: list[int]) -> list[HeldJob]:
    """Those of `job_ids` that are pending under the requeue hold with the marker: one one-job query each
    (`squeue -h -j J`, about what `scontrol show job J` costs slurmctld), never the queue."""
    held: list[HeldJob] = []
    for job_id in job_ids:
        res = client.runner.run(
            "squeue", "-h", "-j", str(job_id), "-t", "PD", "-o", "%i|%r|%k", check=False, retry=False
        )
        if res.returncode == 0:
            held += parse_held(res.stdout)
    return held


def release_requeued_job(client: SlurmClient, job: HeldJob) -> None:
    """Start a requeued job now rather than after Slurm's hold (cred_expire + 1 s, two minutes by
    default; the hold shows as Reason=BeginTime), and take the marker off its comment. Root only."""
    client.runner.run("scontrol", "update", f"jobid={job.job_id}", "StartTime=now", retry=False)
    client.runner.run(
        "scontrol", "update", f"jobid={job.job_id}", f"Comment={with_requeue_marker(job.comment, False)}", retry=False
    )
