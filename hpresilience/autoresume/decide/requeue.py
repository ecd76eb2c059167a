"""How a requeue of the wrapper's own job gets its job running again without Slurm's two-minute hold.

Two paths. Slurm's own (25.11+): a job submitted with `--requeue=expedite` on a cluster with
`SlurmctldParameters=enable_expedited_requeue` is eligible again the moment it is requeued (26.05.5: running again
2 s after `scontrol requeue`), so nothing else is needed. The controller's (every release, the only one on 22.05 and
24.11): the requeue marker, a word in the job's comment that tells the controller (root) a requeue is the wrapper's
own, so it starts the job again at once instead of after the hold. The comment survives the requeue; the controller
takes the word off when it releases the job, and the requeued wrapper does if Slurm started it anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpresilience.autoresume.report import Reporter
from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.features import SlurmFeatures, job_requeue_expedited
from hpresilience.slurm.jobs import has_requeue_marker, job_comment, set_job_comment, with_requeue_marker

log = get_logger("hpresilience.autoresume")
VIA_SLURM = "slurm_expedited_requeue"
VIA_CONTROLLER = "controller_release"


@dataclass(frozen=True)
class RequeuePath:
    """Which path a requeue of this job takes; `features`: what the probe found (None: not probed)."""

    expedited: bool = False
    features: SlurmFeatures | None = None

    @property
    def via(self) -> str:
        return VIA_SLURM if self.expedited else VIA_CONTROLLER

    def fields(self) -> dict[str, object]:
        """What the wrapper's start event says of it."""
        names = self.features.names() if self.features is not None else None
        return {"requeue_via": self.via, "slurm_features": names}


def choose_requeue_path(client: SlurmClient, details: Mapping[str, str]) -> RequeuePath:
    """Once, at the wrapper's start. Only a job that asked for `--requeue=expedite` (its own record says so) pays
    for the probe of the cluster's config; Slurm expedites it only where the cluster allows it, so the probe must
    say so too. An unreadable probe keeps the controller's path: never wrong, only slower where Slurm could do it."""
    if not job_requeue_expedited(details):
        return RequeuePath()
    try:
        features = client.features()
    except HPResilienceError as err:
        log.warning("slurm_features_probe_failed", error=str(err)[:300])
        return RequeuePath()
    return RequeuePath(features.expedited_requeue, features)


def prepare_requeue(client: SlurmClient, job_id: int, reporter: Reporter, path: RequeuePath) -> None:
    """Before the wrapper requeues its job: the marker on, unless Slurm itself starts the job again at once."""
    if not path.expedited:
        mark_for_release(client, job_id, reporter)


def mark_for_release(client: SlurmClient, job_id: int, reporter: Reporter) -> None:
    """The marker on, for the controller's release."""
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
