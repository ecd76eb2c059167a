"""`hpresilience job JOBID` and `hpresilience goodput`: where a job's, or the cluster's, training time went."""

from __future__ import annotations

import time

import click

from hpresilience.commands.context import Ctx, pass_ctx
from hpresilience.errors import HPResilienceError
from hpresilience.goodput.jobs import ClusterGoodput, load_ledger, render_cluster
from hpresilience.goodput.ledger import render
from hpresilience.log import printable
from hpresilience.slurm.accounting import finished_jobs, job_record, since_seconds
from hpresilience.slurm.client import SlurmClient


@click.command()
@click.argument("job_id", type=click.IntRange(min=1))
@pass_ctx
def job(c: Ctx, job_id: int) -> None:
    """A job's goodput ledger: badput by category and one line per restart (from any directory)."""
    client = SlurmClient.from_settings(c.config.slurm)
    record = job_record(client, job_id)
    if record is None:
        raise HPResilienceError(f"job {job_id}: neither slurmctld nor slurmdbd knows it")
    ledger = load_ledger(record, c.config.autoresume.state_dir, now=time.time())
    if ledger is None:
        raise HPResilienceError(
            f"job {job_id}: no ledger under {printable(record.work_dir) or '(no working directory)'}"
            "/.hpresilience/jobs (not run with srun --auto-resume=1, not readable here, or not a regular file "
            "of the job's user: the log says which)"
        )
    data = {**ledger.to_dict(), "user": record.user, "partition": record.partition, "state": record.state}
    c.emit(data, render(ledger))


@click.command()
@click.option("--since", "since", default="7d", show_default=True, help="How far back: 30m, 12h, 7d, 2w.")
@click.option("--user", default="", help="Only this user's jobs.")
@click.option("--partition", default="", help="Only jobs of this partition.")
@pass_ctx
def goodput(c: Ctx, since: str, user: str, partition: str) -> None:
    """The sum of the ledgers of the jobs slurmdbd lists: badput by category, by cause, costliest nodes."""
    client = SlurmClient.from_settings(c.config.slurm)
    total = ClusterGoodput()
    for record in finished_jobs(client, since_seconds(since), user, partition):
        ledger = load_ledger(record, c.config.autoresume.state_dir, now=time.time())
        if ledger is None or not ledger.attempts:
            total.without_ledger += 1
            continue
        total.add(record, ledger)
    c.emit(total.to_dict(), render_cluster(total))
