"""Getting the step back to size after a hardware fault, cheapest rung first.

1. Release the bad nodes. With slurmdbd (every production cluster) a job can be resized again and again;
   with accounting_storage/none Slurm refuses any update of a job after its first resize, and a job whose
   resize met an unreachable slurmdbd refuses them for good ("DB index is being set"): then bad nodes stay
   in the allocation, out of the step. The batch host is never released, since that would kill the batch
   script and this wrapper with it.
2. Hot spares already in the allocation: no Slurm round trip at all.
3. Grow the job with the expand dependency, when configured and the cluster permits it (probed once),
   waiting with visible progress for the replaced node or any idle node, up to replace_timeout_s.
4. Nothing: the caller asks the restart policy whether to requeue the job or to fail.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hpresilience.autoresume.classify import node_is_bad
from hpresilience.autoresume.plan import plan_nodes
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperState
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.hostlist import compress
from hpresilience.slurm.models import Job
from hpresilience.waiting import WaitTimeout, wait_for

# slurmctld's answer to any update of a job whose accounting record cannot be written: final for that job.
DB_INDEX_REFUSAL = "DB index"


class NoReplacement(HPResilienceError):
    """No healthy node could be found for the step within the allocation or by growing it."""


class Capacity:
    def __init__(self, client: SlurmClient, job_id: int, state: WrapperState, reporter: Reporter, *,
                 grow: bool, replace_timeout_s: float, progress_every_s: float = 5.0) -> None:
        self.client = client
        self.job_id = job_id
        self.state = state
        self.reporter = reporter
        self.grow = grow
        self.replace_timeout_s = replace_timeout_s
        self.progress_every_s = progress_every_s
        self._expansion: bool | None = None
        self._accounting: bool | None = None
        self._unreachable: set[str] = set()

    def accounting(self) -> bool:
        if self._accounting is None:
            try:
                self._accounting = self.client.accounting_enabled()
            except HPResilienceError as err:
                self.reporter.decision("accounting_probe_failed", error=str(err))
                self._accounting = False  # the cautious answer: at most one resize
        return self._accounting

    def can_resize_again(self) -> str | None:
        """None when the job may be resized now, else why not."""
        if self.state.resize_refused:
            return "Slurm refused to resize this job for good (its DB index was never set)"
        if self.state.resized and not self.accounting():
            return "the job was resized once already and without slurmdbd Slurm refuses a second resize"
        return None

    def expansion_permitted(self) -> bool:
        if self._expansion is None:
            try:
                self._expansion = self.client.permits_job_expansion()
            except HPResilienceError as err:
                self.reporter.decision("expansion_probe_failed", error=str(err))
                self._expansion = False
        return self._expansion

    def unhealthy(self, job: Job) -> set[str]:
        """Nodes of the allocation the step must not use: bad in Slurm's eyes, or blamed and kept out."""
        by_name = {n.name: n for n in self.client.known_nodes(job.nodes)}  # the job's nodes only, by name
        self._unreachable = {n for n in job.nodes if n in by_name and by_name[n].has("NOT_RESPONDING", "DOWN")}
        bad = {n for n in job.nodes if n in by_name and node_is_bad(by_name[n])}
        return bad | (set(self.state.kept_out) & set(job.nodes))

    def recover(self, bad: Sequence[str], previous: Sequence[str], size: int) -> list[str]:
        """The node list for the next attempt after `bad` failed, or NoReplacement."""
        self.state.blame(list(bad))
        for n in bad:
            if n not in self.state.kept_out:
                self.state.kept_out.append(n)
        job = self.client.job(self.job_id)
        unhealthy = self.unhealthy(job)
        job = self._release(job, unhealthy)
        plan = plan_nodes(job.nodes, size, unhealthy, previous)
        if plan is not None:
            self._swapped(previous, plan, "hot_spare")
            return plan
        if not self.grow:
            raise NoReplacement(f"{len(job.nodes) - len(unhealthy & set(job.nodes))} healthy node(s) left for a "
                                f"{size}-node step, no hot spare, and growing the job is off (grow_by_expansion)")
        if not self.expansion_permitted():
            raise NoReplacement("no hot spare left and this cluster does not permit job expansion "
                                "(SchedulerParameters lacks permit_job_expansion)")
        healthy = [n for n in job.nodes if n not in unhealthy]
        grown = self._grow(size - len(healthy))
        plan = plan_nodes(grown.nodes, size, unhealthy, previous)
        if plan is None:
            raise NoReplacement(f"job grew to {compress(grown.nodes)} but still lacks healthy nodes")
        self._swapped(previous, plan, "grown")
        return plan

    def _release(self, job: Job, unhealthy: set[str]) -> Job:
        # A node that stopped answering is Slurm's to excise (--no-kill): releasing it ourselves raced with
        # that on the devcluster and ended the whole job. Only responsive bad nodes (FAIL, DRAIN) are released.
        release = [n for n in job.nodes if n in unhealthy and n != job.batch_host and n not in self._unreachable]
        if job.batch_host in unhealthy:
            self.reporter.decision("nodes_kept_in_allocation", nodes=job.batch_host,
                                   why="it is the batch host: releasing it would end the batch script")
        refused = self.can_resize_again() if release else None
        if not release or refused:
            if release:
                self.reporter.decision("nodes_kept_in_allocation", nodes=compress(release), why=refused)
            return job
        keep = [n for n in job.nodes if n not in release]
        # Whatever the outcome, Slurm may now consider the job resized.
        self.state.resized = True
        try:
            job = self.client.shrink_job(self.job_id, keep)
        except HPResilienceError as err:
            if DB_INDEX_REFUSAL in str(err):
                self.state.resize_refused = True
            self.reporter.decision("allocation_shrink_failed", nodes=compress(release), error=str(err)[:300],
                                   final=self.state.resize_refused)
            return self.client.job(self.job_id)
        self.state.kept_out = [n for n in self.state.kept_out if n in job.nodes]
        self.reporter.decision("allocation_shrunk", released=compress(release), nodes=compress(job.nodes))
        return job

    def _grow(self, count: int) -> Job:
        started = time.monotonic()
        exclude = set(self.state.kept_out)
        # Idle nodes of the job's partition only: the listing stays small on a large cluster.
        partition = self.client.job(self.job_id).partition

        def idle_nodes() -> list[str] | None:
            idle = [n for n in self.client.idle_nodes(partition) if n not in exclude]
            return idle[:count] if len(idle) >= count else None

        def progress(what: str, waited: float) -> None:
            self.reporter.decision("waiting_for_replacement", what=what, waited_s=round(waited, 1),
                                   timeout_s=self.replace_timeout_s)

        self.reporter.decision("waiting_for_replacement", count=count, timeout_s=self.replace_timeout_s)
        try:
            chosen = wait_for(idle_nodes, f"{count} idle node(s) to grow job {self.job_id}",
                              self.replace_timeout_s, interval=0.5, progress_every=self.progress_every_s,
                              on_progress=progress)
            left = max(5.0, self.replace_timeout_s - (time.monotonic() - started))
            grown = self.client.grow_job(self.job_id, count, nodes=chosen, timeout=left)
        except (WaitTimeout, HPResilienceError) as err:
            raise NoReplacement(f"could not grow job {self.job_id} by {count} node(s): {err}") from None
        self.state.resized = True
        self.reporter.decision("allocation_grown", nodes=compress(grown.nodes), added=compress(chosen),
                               waited_s=round(time.monotonic() - started, 2))
        return grown

    def _swapped(self, previous: Sequence[str], plan: Sequence[str], source: str) -> None:
        swaps: list[dict[str, Any]] = [{"slot": i, "old": old, "new": new}
                                       for i, (old, new) in enumerate(zip(previous, plan, strict=False)) if old != new]
        self.reporter.decision("node_swapped", source=source, swaps=swaps, nodes=",".join(plan))

