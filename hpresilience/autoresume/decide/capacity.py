"""Getting the step back to size after a hardware fault, cheapest rung first.

1. Release the bad nodes. With slurmdbd (every production cluster) a job can be resized again and again;
   with accounting_storage/none Slurm refuses any update of a job after its first resize, and a job whose
   resize met an unreachable slurmdbd refuses them for good ("DB index is being set"): then bad nodes stay
   in the allocation, out of the step. The batch host is never released, since that would kill the batch
   script and this wrapper with it.
2. Hot spares already in the allocation: no Slurm round trip at all.
3. Grow the job with the expand dependency (on by default; used where the cluster permits it, probed
   once), waiting with a progress line every few seconds, up to replace_timeout_s, for a healthy node:
   the repaired node back under its name (HyperPod's semantics) or any idle node of the job's partition.
4. Nothing: the caller asks the restart policy whether to requeue the job or to fail, with the exact
   reason. A failed batch host is a case of its own (BatchHostLost): it can never leave the job, so the
   job's NodeList would keep naming it; the job is requeued at once onto healthy nodes instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from hpresilience.autoresume.decide.rejoin import wait_out_revocation
from hpresilience.autoresume.launch.plan import plan_nodes
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperState
from hpresilience.autoresume.watch.nodewatch import node_is_bad
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.hostlist import compress
from hpresilience.slurm.models import Job, Node
from hpresilience.waiting import WaitTimeout, wait_for

# slurmctld's answer to any update of a job whose accounting record cannot be written: final for that job.
DB_INDEX_REFUSAL = "DB index"


class NoReplacement(HPResilienceError):
    """No healthy node could be found for the step within the allocation or by growing it."""


class BatchHostLost(NoReplacement):
    """The batch host is bad: it cannot leave the job without ending the batch script, so the job's own
    NodeList (what `scontrol show jobid` tells a training script) would keep naming a failed node."""


class Capacity:
    def __init__(
        self,
        client: SlurmClient,
        job_id: int,
        state: WrapperState,
        reporter: Reporter,
        *,
        grow: bool,
        replace_timeout_s: float,
        progress_every_s: float = 5.0,
        min_nodes: int = 0,
        settle: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.state = state
        self.reporter = reporter
        self.grow = grow
        self.replace_timeout_s = replace_timeout_s
        self.progress_every_s = progress_every_s
        self.min_nodes = min_nodes  # 0: off; else run short on at least this many healthy nodes at once
        self.settle = settle  # waits until a failed node no longer holds the job's old step (before release)
        self._expansion: bool | None = None
        self._accounting: bool | None = None
        self._unreachable: set[str] = set()
        self._slurm_lost: set[str] = set()  # NOT_RESPONDING or DOWN in Slurm's eyes already
        self._dead: set[str] = set()  # ran no probe task: treated as Slurm will once SlurmdTimeout passes
        self._released_at: dict[str, float] = {}  # node -> when it left the job (wall clock; rejoin.py)

    def _probe(self, failed_event: str, probe: Callable[[], bool]) -> bool:
        """One look at how the cluster is configured; a failed look is the cautious answer, no."""
        try:
            return probe()
        except HPResilienceError as err:
            self.reporter.decision(failed_event, error=str(err))
            return False

    def accounting(self) -> bool:
        if self._accounting is None:  # a failed probe means at most one resize
            self._accounting = self._probe("accounting_probe_failed", self.client.accounting_enabled)
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
            self._expansion = self._probe("expansion_probe_failed", self.client.permits_job_expansion)
        return self._expansion

    def unhealthy(self, job: Job) -> set[str]:
        """Nodes of the allocation the step must not use: bad in Slurm's eyes, or blamed and kept out."""
        by_name = {n.name: n for n in self.client.known_nodes(job.nodes)}  # the job's nodes only, by name
        self._slurm_lost = {n for n in job.nodes if n in by_name and by_name[n].has("NOT_RESPONDING", "DOWN")}
        self._unreachable = self._slurm_lost | (self._dead & set(job.nodes))
        bad = {n for n in job.nodes if n in by_name and node_is_bad(by_name[n])}
        return bad | (set(self.state.kept_out) & set(job.nodes))

    def mark_unanswering(self, nodes: Sequence[str]) -> None:
        """Nodes that stopped answering though Slurm does not know yet: kept out of the step, and released from
        the job while Slurm still calls them responding (release says why)."""
        self._dead |= set(nodes)

    def recover(self, bad: Sequence[str], previous: Sequence[str], size: int) -> list[str]:
        """The node list for the next attempt after `bad` failed, or NoReplacement."""
        self.state.blame(list(bad))
        for n in bad:
            if n not in self.state.kept_out:
                self.state.kept_out.append(n)
        job = self.client.job(self.job_id)
        unhealthy = self.unhealthy(job)
        if plan_nodes(job.nodes, size, unhealthy, previous) is None and not self._idle_at_hand(job, unhealthy, size):
            # No replacement at hand: run short (min_nodes), or wait for one, which may be the failed node itself.
            short = self._short_plan(job, unhealthy, previous, size)
            if short is not None:
                self._release_short(job, unhealthy)
                return short
            if self.settle is not None and self.grow and self.expansion_permitted():
                self.settle([n for n in bad if n in job.nodes and n not in self._unreachable])
        job = self.release(job, unhealthy)
        plan = plan_nodes(job.nodes, size, unhealthy, previous)
        if plan is not None:
            self._swapped(previous, plan, "hot_spare")
            return plan
        left = len(job.nodes) - len(unhealthy & set(job.nodes))
        if job.batch_host and job.batch_host in unhealthy and job.batch_host not in self._unreachable:
            # A spare (above) may take its slot in the step; growing instead would leave a job whose NodeList
            # names a failed node, which is what scripts that read `scontrol show jobid` (HyperPod's recipe) use.
            raise BatchHostLost(
                f"node {job.batch_host} failed and it is the batch host: it cannot leave the job, "
                f"so the job's NodeList would keep naming it; requeueing onto healthy nodes"
            )
        lacking = f"{left} healthy node(s) left for a {size}-node step, no hot spare, and "
        if not self.grow:
            raise NoReplacement(
                lacking + "growing the job is off (--auto-resume-no-grow / autoresume.grow_by_expansion: false)"
            )
        if not self.expansion_permitted():
            raise NoReplacement(
                lacking + "this cluster does not permit job expansion (SchedulerParameters lacks "
                "permit_job_expansion), so no node can join the running job"
            )
        grown, added = self._grow(size - left, job.partition)
        wait_out_revocation(self._released_at, added, self.reporter)
        # A node that joined was idle, so usable, a moment ago: a blamed node among them is the failed node back
        # after repair under its own name (HyperPod's replacement, and the only one on a full cluster). It no
        # longer stays out; the set is read again so that a node marked meanwhile is still left out.
        self.state.kept_out = [n for n in self.state.kept_out if n not in added]
        unhealthy = self.unhealthy(grown)
        plan = plan_nodes(grown.nodes, size, unhealthy, previous)
        if plan is None:
            raise NoReplacement(f"job grew to {compress(grown.nodes)} but still lacks healthy nodes")
        self._swapped(previous, plan, "grown")
        return plan

    def _idle_at_hand(self, job: Job, unhealthy: set[str], size: int) -> bool:
        """Whether growing the job would find its missing nodes idle now (one query of the partition's idle
        nodes): then the grow takes them at once. Otherwise a failed node released while its slurmstepd still
        ends the old step may be the replacement that joins again, and it must leave clean (settle)."""
        if not self.grow or not self.expansion_permitted():
            return False
        missing = size - len([n for n in job.nodes if n not in unhealthy])
        try:
            return len(self.client.idle_nodes(job.partition)) >= missing
        except HPResilienceError:
            return False

    def _short_plan(self, job: Job, unhealthy: set[str], previous: Sequence[str], size: int) -> list[str] | None:
        """--auto-resume-min-nodes: the healthy nodes of the step (in their slots' order), when at least min_nodes,
        for a relaunch at once; the failed nodes leave the job (_release_short)."""
        if not self.min_nodes or (job.batch_host in unhealthy and job.batch_host not in self._unreachable):
            return None
        healthy = [n for n in job.nodes if n not in unhealthy]
        plan = [n for n in previous if n in healthy] + [n for n in healthy if n not in previous]
        plan = plan[:size]
        if len(plan) < self.min_nodes:
            return None
        self.reporter.decision(
            "running_short",
            nodes=",".join(plan),
            nodes_now=len(plan),
            nodes_requested=size,
            min_nodes=self.min_nodes,
            left_out=",".join(sorted(unhealthy & set(job.nodes))),
        )
        return plan

    def _release_short(self, job: Job, unhealthy: set[str]) -> None:
        """Running short, the failed nodes leave the job before the short step starts: the controller repairs
        a node only once no job holds it (else it waits up to forced_down_after_s, 600 s), and the job's
        NodeList, which the training script reads (`scontrol show jobid`: HyperPod's NODE_LIST and
        MASTER_ADDR), must not name a dead node. The repaired node comes back idle and grow back merges it
        (back_in_service). Without slurmdbd a job is resized once only: releasing would forbid that grow, so
        the node stays in the job, out of the step, and is taken back once resumed."""
        if not self.grow or not self.expansion_permitted():
            why = "the job cannot grow back (no expansion), so the node stays in it until it is back"
        elif not self.accounting():
            why = "without slurmdbd the job could not grow back after a release, so the node stays until it is back"
        else:
            self.release(job, unhealthy)
            return
        left = sorted(n for n in job.nodes if n in unhealthy and n != job.batch_host)
        if left:
            self.reporter.decision("nodes_kept_in_allocation", nodes=compress(left), why=why)

    def back_in_service(self, size: int, previous: Sequence[str]) -> list[str] | None:
        """While running short: the full plan once the nodes kept out are healthy again, or once idle nodes of
        the partition can be merged into the job (one read of the job, one of the kept-out nodes by name, one
        of the partition's idle nodes: O(1) Slurm calls, the replacement wait's queries), else None."""
        job = self.client.job(self.job_id)
        kept = [n for n in self.state.kept_out if n in job.nodes]
        back = (
            [
                n.name
                for n in self.client.known_nodes(kept)
                if not node_is_bad(n) and not n.has("NOT_RESPONDING", "DOWN", "DRAIN")
            ]
            if kept
            else []
        )
        if not back:
            return self._grow_into_idle(job, size, previous, set(kept))
        plan = plan_nodes(job.nodes, size, (set(kept) - set(back)), [*previous, *back])
        if plan is None:
            return None
        self.state.kept_out = [n for n in self.state.kept_out if n not in back]
        self._swapped(previous, plan, "back_in_service")
        return plan

    def settle_returning(self, target: Sequence[str], previous: Sequence[str]) -> None:
        """Before a grow back: a failed node that left the job when the step went short and joined it again
        after a fast repair may still be ending the job's old step (settle says why)."""
        returning = [n for n in target if n not in previous and n in self.state.blamed_nodes]
        if returning and self.settle is not None:
            self.settle(returning)

    def _grow_into_idle(self, job: Job, size: int, previous: Sequence[str], kept: set[str]) -> list[str] | None:
        missing = size - len(previous)
        if missing <= 0 or not self.grow or not self.expansion_permitted():
            return None
        idle = self.client.idle_nodes(job.partition)
        if len(idle) < missing:
            return None
        chosen = sorted(idle)[:missing]
        grown = self.take_in(chosen)
        if grown is None:
            return None
        plan = plan_nodes(grown.nodes, size, kept, [*previous, *chosen])
        if plan is not None:
            self._swapped(previous, plan, "grown")
        return plan

    def take_in(self, chosen: Sequence[str], timeout: float = 30.0, **said: Any) -> Job | None:
        """Merge the idle nodes `chosen` into the job (one grow, within `timeout`), ready for a step: the job grown,
        or None when Slurm refused (another job took them first: the caller looks again later). `said`: added to
        the event."""
        try:
            grown = self.client.grow_job(self.job_id, len(chosen), nodes=chosen, timeout=timeout)
        except HPResilienceError as err:
            self.reporter.decision("grow_attempt_failed", nodes=compress(chosen), error=str(err)[:200])
            return None
        self.state.resized = True
        self.reporter.decision("allocation_grown", nodes=compress(grown.nodes), added=compress(chosen), **said)
        wait_out_revocation(self._released_at, chosen, self.reporter)
        return grown

    def release(self, job: Job, unhealthy: set[str]) -> Job:
        # A node Slurm already calls NOT_RESPONDING or DOWN is Slurm's to excise (--no-kill): releasing it
        # ourselves raced with that on the devcluster and ended the whole job. One that ran no probe task while
        # Slurm still calls it responding (a partition, seconds old) leaves now: once SlurmdTimeout passes Slurm
        # sets it DOWN and kills or requeues every job holding it (all jobs but --no-kill ones; issue 36).
        release = [n for n in job.nodes if n in unhealthy and n != job.batch_host and n not in self._slurm_lost]
        if job.batch_host in unhealthy:
            self.reporter.decision(
                "nodes_kept_in_allocation",
                nodes=job.batch_host,
                why="it is the batch host: releasing it would end the batch script",
            )
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
            self.reporter.decision(
                "allocation_shrink_failed",
                nodes=compress(release),
                error=str(err)[:300],
                final=self.state.resize_refused,
            )
            return self.client.job(self.job_id)
        self._released_at.update(dict.fromkeys(release, time.time()))
        self.state.kept_out = [n for n in self.state.kept_out if n in job.nodes]
        self.reporter.decision("allocation_shrunk", released=compress(release), nodes=compress(job.nodes))
        return job

    def _grow(self, count: int, partition: str) -> tuple[Job, list[str]]:
        """Wait for `count` usable idle nodes and merge them into the job, until replace_timeout_s: the job
        grown, and the nodes added."""
        started = time.monotonic()
        deadline = started + self.replace_timeout_s
        blamed = set(self.state.blamed_nodes)
        last_view = "no node was looked at"
        last_error = ""
        said = {"count": count, "timeout_s": self.replace_timeout_s}

        def usable() -> list[str] | None:
            nonlocal last_view
            # Idle nodes of the job's partition, and the states of the nodes this job blamed: both sized by
            # the job, never the whole cluster's table.
            idle = self.client.idle_nodes(partition)
            # Nodes this job never blamed first; a blamed node that is idle again was repaired (or resumed).
            idle = sorted(idle, key=lambda name: name in blamed)
            watched = self.client.known_nodes(sorted(blamed)) if blamed else []
            last_view = _describe(watched, partition, len(idle))
            return idle[:count] if len(idle) >= count else None

        def progress(what: str, waited: float) -> None:
            self.reporter.decision("waiting_for_replacement", waited_s=round(waited, 1), nodes_now=last_view, **said)

        self.reporter.decision("waiting_for_replacement", waited_s=0.0, partition=partition or None, **said)
        while True:
            left = deadline - time.monotonic()
            try:
                chosen = wait_for(
                    usable,
                    f"{count} idle node(s) to grow job {self.job_id}",
                    max(0.0, left),
                    interval=0.2,
                    progress_every=self.progress_every_s,
                    on_progress=progress,
                )
            except WaitTimeout:
                waited = time.monotonic() - started
                raise NoReplacement(
                    f"waited {waited:.0f} s (replace_timeout_s) for {count} healthy node(s) to "
                    f"grow job {self.job_id} into, and none became usable: {last_view}"
                    + (f"; last grow attempt: {last_error}" if last_error else "")
                ) from None
            except HPResilienceError as err:
                raise NoReplacement(f"could not read node states while waiting for a replacement: {err}") from None
            try:
                grown = self.client.grow_job(
                    self.job_id, count, nodes=chosen, timeout=max(5.0, min(60.0, deadline - time.monotonic()))
                )
            except HPResilienceError as err:
                # Another job took the node between our look and the request: look again, until the deadline.
                last_error = str(err)[:200]
                self.reporter.decision("grow_attempt_failed", nodes=compress(chosen), error=last_error)
                if time.monotonic() >= deadline:
                    raise NoReplacement(f"could not grow job {self.job_id} by {count} node(s): {last_error}") from None
                time.sleep(0.5)
                continue
            self.state.resized = True
            self.reporter.decision(
                "allocation_grown",
                nodes=compress(grown.nodes),
                added=compress(chosen),
                waited_s=round(time.monotonic() - started, 2),
            )
            return grown, list(chosen)

    def _swapped(self, previous: Sequence[str], plan: Sequence[str], source: str) -> None:
        swaps: list[dict[str, Any]] = [
            {"slot": i, "old": old, "new": new}
            for i, (old, new) in enumerate(zip(previous, plan, strict=False))
            if old != new
        ]
        self.reporter.decision("node_swapped", source=source, swaps=swaps, nodes=",".join(plan))


def _describe(watched: Sequence[Node], partition: str, idle: int) -> str:
    """What the wait saw, for its progress lines and its final reason:
    `0 idle node(s) in partition debug; blamed: n2 fail+...(Action:Replace)`."""
    where = f"partition {partition}" if partition else "the cluster"
    parts = [f"{n.name} {n.state_text}" + (f" ({n.reason})" if n.reason else "") for n in watched[:12]]
    more = f" and {len(watched) - 12} more" if len(watched) > 12 else ""
    return f"{idle} idle node(s) in {where}" + (f"; blamed: {', '.join(parts)}{more}" if parts else "")
