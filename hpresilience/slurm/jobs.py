"""Operations on jobs beyond SlurmClient's: details only the text form shows, the comment, and the requeue
marker that lets the controller start a requeued job without Slurm's hold."""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from hpresilience.errors import SlurmError, SlurmParseError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.exact import framed_records, json_job, json_states, json_text, record_mark
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


# squeue's fields of a held job, the comment last (the only one a user writes): `%A`, the job's own id (unique for
# each task of an array; `%i` prints `J_[0-2]`).
HELD_FIELDS = "%A|%r|%k"


def _held_record(record: str) -> HeldJob | None:
    fields = record.split("|", 2)
    if len(fields) != 3 or not (fields[0].isascii() and fields[0].isdigit()):
        return None
    job, reason, comment = fields
    return HeldJob(int(job), reason, "" if comment == _NULL else comment)


def _is_held(job: HeldJob) -> bool:
    # Only jobs under the hold: any other pending reason is the scheduler's business, not a requeue's.
    return job.reason == "BeginTime" and has_requeue_marker(job.comment)


def parse_held(text: str, mark: str) -> list[HeldJob]:
    """`squeue -h -o MARK%A|%r|%k` (records framed by the query's mark, exact whatever a comment holds): the
    pending jobs under Slurm's requeue hold whose comment has the marker. SlurmParseError on any other shape."""
    records = [_held_record(r) for r in framed_records(text, mark, "squeue -o " + HELD_FIELDS)]
    return [h for h in records if h is not None and _is_held(h)]


def held_job(client: SlurmClient, job_id: int) -> HeldJob | None:
    """Job `job_id` if it is pending under the requeue hold with the marker, read exactly by a one-job query:
    `scontrol --json show job J` on 23.02+, a framed `squeue -h -j J -t PD` on 22.05. None otherwise, and
    when the answer is not exactly the one record asked for (logged): nothing is started on a guess."""
    try:
        if client.scontrol_has_json:
            res = client.runner.run("scontrol", "--json", "show", "job", str(job_id), check=False, retry=False)
            if res.returncode != 0:
                return None
            record = json_job(res.stdout, job_id, "scontrol --json show job")
            if record is None or "PENDING" not in json_states(record):
                return None
            job = HeldJob(job_id, json_text(record, "state_reason"), json_text(record, "comment"))
        else:
            mark = record_mark()
            res = client.runner.run(
                "squeue", "-h", "-j", str(job_id), "-t", "PD", "-o", mark + HELD_FIELDS, check=False, retry=False
            )
            if res.returncode != 0:
                return None
            found = [h for h in map(_held_record, framed_records(res.stdout, mark, "squeue -o")) if h is not None]
            mine = [h for h in found if h.job_id == job_id]
            if len(mine) != 1:
                return None
            job = mine[0]
    except SlurmParseError as err:
        log.warning("held_job_unreadable", job_id=job_id, error=str(err)[:300])
        return None
    return job if _is_held(job) else None


def requeued_jobs_held(client: SlurmClient, known: Collection[int] = ()) -> list[HeldJob]:
    """Pending jobs whose comment carries REQUEUE_MARKER: the whole pending queue, read with framed records
    (text squeue: unlike --json it honours -t), then each job found read again by itself (held_job) before
    anything acts on it; those in `known` are left out (already read). The scan costs slurmctld the pending
    queue: see held_among for the jobs known."""
    mark = record_mark()
    res = client.runner.run("squeue", "-h", "-t", "PD", "-o", mark + HELD_FIELDS, retry=False)
    try:
        found = parse_held(res.stdout, mark)
    except SlurmParseError as err:
        log.warning("pending_queue_unreadable", error=str(err)[:300])
        return []
    return held_among(client, [h.job_id for h in found if h.job_id not in known])


def held_among(client: SlurmClient, job_ids: Iterable[int]) -> list[HeldJob]:
    """Those of `job_ids` that are pending under the requeue hold with the marker: one one-job query each
    (held_job: what a job costs slurmctld, under 1 ms at 10,000 nodes), never the queue."""
    return [h for h in map(lambda j: held_job(client, j), dict.fromkeys(job_ids)) if h is not None]


def release_requeued_job(client: SlurmClient, job: HeldJob) -> None:
    """Start a requeued job now rather than after Slurm's hold (cred_expire + 1 s, two minutes by
    default; the hold shows as Reason=BeginTime), and take the marker off its comment. Root only: `job` must
    come from held_job's exact one-job read (the comment written back is the one read there)."""
    client.runner.run("scontrol", "update", f"jobid={job.job_id}", "StartTime=now", retry=False)
    client.runner.run(
        "scontrol", "update", f"jobid={job.job_id}", f"Comment={with_requeue_marker(job.comment, False)}", retry=False
    )
