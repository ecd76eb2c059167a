"""Slurm operations the replacement controller needs beyond SlurmClient's."""

from __future__ import annotations

from dataclasses import dataclass

from hpresilience.log import get_logger
from hpresilience.slurm.autoresume_ops import REQUEUE_MARKER, with_requeue_marker
from hpresilience.slurm.client import SlurmClient

log = get_logger("hpresilience.slurm")


def set_node_address(client: SlurmClient, name: str, address: str, hostname: str = "") -> None:
    """Point node `name` at a replacement machine: `scontrol update nodename=X nodeaddr=A [nodehostname=H]`.

    The Slurm name stays; only where slurmctld reaches it changes (an EC2 replacement has a new private IP).
    """
    args = ["update", f"nodename={name}", f"nodeaddr={address}"]
    if hostname:
        args.append(f"nodehostname={hostname}")
    client.runner.run("scontrol", *args)
    log.info("node_address_set", node=name, address=address, hostname=hostname or None)




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
