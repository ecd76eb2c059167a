"""The requeue marker: a word in the job's comment that tells the controller (root) a requeue is the wrapper's
own, so it starts the job again at once instead of after Slurm's hold. The comment survives the requeue; the
controller takes the word off when it releases the job, and the requeued wrapper does if Slurm started it anyway.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpresilience.autoresume.report import Reporter
from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.jobs import has_requeue_marker, job_comment, set_job_comment, with_requeue_marker

log = get_logger("hpresilience.autoresume")


def mark_for_release(client: SlurmClient, job_id: int, reporter: Reporter) -> None:
    """Before the wrapper requeues its job: the marker on."""
    try:
        comment = job_comment(client, job_id)  # the comment alone, byte for byte
        set_job_comment(client, job_id, with_requeue_marker(comment, True))
    except HPResilienceError as err:
        reporter.decision("requeue_marker_not_set", error=str(err)[:300])


def clear_requeue_marker(client: SlurmClient, job_id: int, restart_count: int, details: Mapping[str, str]) -> None:
    """When the wrapper starts: the marker off, if it is there."""
    # Only a requeued run can carry the marker. The one-line form cuts a comment at its first `k=v` word,
    # so the comment is read alone (one job query) before it is looked at or written back.
    if restart_count == 0 and not has_requeue_marker(details.get("Comment", "")):
        return
    try:  # the controller takes it off when it releases the job; this covers a job Slurm started anyway
        comment = job_comment(client, job_id)
        if has_requeue_marker(comment):
            set_job_comment(client, job_id, with_requeue_marker(comment, False))
    except HPResilienceError as err:
        log.warning("requeue_marker_not_cleared", error=str(err)[:300])
