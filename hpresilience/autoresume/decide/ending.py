"""Why an ended step ended, decided once, after the step: its exit code, what srun said, the verdict that
stopped it (if one did), and Slurm's view of its nodes (classify.py), then the closer looks a cause may need.

A hang with an unambiguous culprit marks that node for a reboot and swaps it out; a collective failure waits a
settle window for a verdict on the nodes, then goes again on the same nodes within collective_retries (a node
implicated twice is a suspect); a step killed by a signal with every node healthy in Slurm's eyes has its nodes
probed (a node that died outright looks exactly so until SlurmdTimeout).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpresilience.autoresume.decide.capacity import Capacity
from hpresilience.autoresume.decide.classify import Cause, Diagnosis, classify
from hpresilience.autoresume.decide.marking import mark_nodes
from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.base import AttemptResult, MarkRequest, StopRequest
from hpresilience.autoresume.watch.collective import CollectiveBudget
from hpresilience.autoresume.watch.feed import RuleFeed
from hpresilience.autoresume.watch.flightrec import read_dumps, wavefront
from hpresilience.autoresume.watch.hang import Attribution
from hpresilience.autoresume.watch.integrity import ROLLBACK_RULE, STOP_RULE
from hpresilience.autoresume.watch.nodewatch import node_is_bad
from hpresilience.autoresume.watch.rules import LogState
from hpresilience.errors import HPResilienceError
from hpresilience.reasons import Action
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.slurm.srun import TASK_END_LINE, application_exit_code
from hpresilience.slurm.steps import nodes_answering

# A step that ended by a signal may have lost a node that Slurm still calls healthy (slurmd dead, nobody
# marked it; Slurm notices after SlurmdTimeout, 300 s by default): every node must answer within this.
LIVENESS_PROBE_S = 3.0
# The integrity watch's trips (watch/integrity.py): a rollback is relaunched, a stop ends the job.
INTEGRITY_CAUSES = {ROLLBACK_RULE: Cause.INTEGRITY, STOP_RULE: Cause.DIVERGED}


def unanswering(
    client: SlurmClient, reporter: Reporter, job_id: int, nodes: Sequence[str], env: Mapping[str, str], **fields: object
) -> tuple[str, ...]:
    """The nodes of `nodes` that run no trivial task within LIVENESS_PROBE_S (asked all at once), logged as
    `nodes_probed` with `fields`: the one liveness probe of an ended step, for both recovery modes."""
    started = time.monotonic()
    answers = nodes_answering(client, job_id, list(nodes), dict(env), LIVENESS_PROBE_S)
    dead = tuple(n for n in nodes if not answers.get(n, False))
    reporter.decision(
        "nodes_probed",
        nodes=",".join(nodes),
        unanswering=",".join(dead) or None,
        **fields,
        took_s=round(time.monotonic() - started, 3),
    )
    return dead


class Ending:
    def __init__(
        self,
        opts: WrapperOptions,
        client: SlurmClient,
        reporter: Reporter,
        progress: ProgressStream,
        feed: RuleFeed,
        capacity: Capacity,
        evidence_root: Path,
        env: Mapping[str, str],
        stop_request: StopRequest,
    ) -> None:
        self.opts = opts
        self.job_id = opts.job_id
        self.client = client
        self.reporter = reporter
        self.progress = progress
        self.feed = feed
        self.capacity = capacity
        self.evidence_root = evidence_root
        self.env = dict(env)
        self.stop_request = stop_request
        # Set by the supervisor when this attempt failed as the one before it did (decide/crashloop.py): a
        # repeated crash is evidence against the program, so the suspects it would name are not marked.
        self.hold_marks = False
        self.collective = CollectiveBudget(
            opts.watch.collective_retries, opts.run_policy.restart_policy.eval_period_seconds
        )

    def exit_code(self, result: AttemptResult) -> int:
        """The step's exit code; for a step that ended by itself (not by our hand), the first failed task's."""
        if result.trip is not None or result.blamed:
            return result.exit_code
        exit_code = application_exit_code(result.exit_code, self.feed.srun_errors)
        if exit_code != result.exit_code:
            self.reporter.decision(
                "step_exit_code_from_first_task", srun_exit_code=result.exit_code, exit_code=exit_code
            )
        return exit_code

    def diagnose(self, exit_code: int, plan: list[str], result: AttemptResult, attempt: int) -> Diagnosis:
        trip, hang = result.trip, result.hang
        try:
            job = self.client.job(self.job_id)
            by_name: dict[str, Node] = {n.name: n for n in self.client.known_nodes([*plan, *job.nodes])}
            allocation: tuple[str, ...] = job.nodes
        except HPResilienceError as err:
            # Never read an unanswering slurmctld as "all healthy": keep what the step itself told us.
            self.reporter.decision("slurm_unreadable_after_step", error=str(err)[:300])
            by_name, allocation = {}, tuple(plan)
        fired = None
        if trip is not None:
            cause = INTEGRITY_CAUSES.get(trip.rule, Cause.SLOW if trip.state is LogState.SLOW else Cause.HANG)
            fired = (cause, f"{trip.name}: {trip.detail}")
        elif hang is not None:
            fired = (Cause.HANG, "; ".join(s.why for s in hang.suspects)[:500] or "no rank or node stood out")
        diagnosis = classify(exit_code, plan, by_name, allocation, self.feed.srun_errors, fired, result.blamed)
        if result.mark is not None:  # a detector asked for its blamed nodes to be marked (watch/base.MarkRequest)
            mark_nodes(self.client, self.reporter, self.job_id, result.blamed, result.mark)
        if diagnosis.cause is Cause.HANG and hang is not None:
            return self._hang_verdict(diagnosis, hang, plan)
        if diagnosis.cause is Cause.APPLICATION and self.progress.signatures():
            return self._collective(diagnosis, plan, exit_code, attempt)
        if diagnosis.cause is Cause.APPLICATION and exit_code > 128:
            return self._check_life(diagnosis, plan, exit_code)
        return diagnosis

    # -- sick, not dead --------------------------------------------------------------------------------
    def _hang_verdict(self, diagnosis: Diagnosis, hang: Attribution, plan: list[str]) -> Diagnosis:
        """An unambiguous culprit is marked for a reboot and swapped out like any bad node; otherwise the
        step goes again on the same nodes, and the events say why."""
        if hang.unambiguous and self._may_mark(hang.nodes[0]):
            node = hang.nodes[0]
            why = "; ".join(s.why for s in hang.suspects if s.node == node)
            if self.mark_suspect(node, f"hang: {why}", str(self.evidence_root)):
                return Diagnosis(Cause.HARDWARE, (node,), f"{node}: {why}", {node: why})
        self.reporter.decision(
            "hang_relaunch_same_nodes",
            nodes=",".join(plan),
            why="evidence is ambiguous" if not hang.unambiguous else "marking is off or failed",
            suspects=",".join(hang.nodes) or None,
        )
        return diagnosis

    def _may_mark(self, node: str) -> bool:
        if self.hold_marks:
            self.reporter.decision("suspect_mark_held", node=node, why="the same crash as the attempt before")
        return self.opts.watch.mark_suspect_nodes and not self.hold_marks

    def mark_suspect(self, node: str, why: str, evidence: str) -> bool:
        request = MarkRequest(Action.REBOOT, why, evidence, "suspect_node_marked")
        return bool(mark_nodes(self.client, self.reporter, self.job_id, [node], request))

    def _collective(self, diagnosis: Diagnosis, plan: list[str], exit_code: int, attempt: int) -> Diagnosis:
        """A collective timeout or abort: wait a settle window for a verdict on the nodes (the agent may
        not have marked a failing node yet), then relaunch on the same nodes within collective_retries."""
        sig = self.progress.signatures()[0]
        settle = self.opts.watch.collective_settle_s
        # NCCL dumps its flight recorder on a watchdog timeout (TORCH_NCCL_DUMP_ON_TIMEOUT, launch/stepops.py) into
        # the attempt's evidence directory: the ranks that never entered the collective.
        front = wavefront(read_dumps(self.evidence_root / f"attempt-{attempt}"), world=sorted(self.progress.ranks()))
        self.reporter.decision(
            "collective_failure_seen",
            kind=sig.kind,
            line=sig.line[:300],
            node=self.progress.node_of_task(sig.task),
            settle_s=settle,
            fr_dumps=front.dumps,
            fr_behind=",".join(map(str, front.ranks)) or None,
        )
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and not self.stop_request:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            try:
                bad = [n.name for n in self.client.known_nodes(plan) if node_is_bad(n)]
            except HPResilienceError:
                continue
            if bad:
                return Diagnosis(
                    Cause.HARDWARE, tuple(bad), "; ".join(f"{n}: marked during the settle window" for n in bad)
                )
        node = first_failed_node(self.feed.srun_errors) or self.progress.node_of_task(sig.task)
        if node is not None and node in plan and self.collective.implicate(node) >= 2:
            why = f"implicated in {self.collective.implicated[node]} collective failures ({sig.kind})"
            if self._may_mark(node) and self.mark_suspect(node, why, sig.line[:120]):
                return Diagnosis(Cause.HARDWARE, (node,), f"{node}: {why}", {node: why})
        if not self.collective.allow():
            self.reporter.decision("collective_retries_exhausted", retries=self.opts.watch.collective_retries)
            return diagnosis
        return Diagnosis(
            Cause.COLLECTIVE,
            (),
            f"{sig.kind}: {sig.line[:200]} (exit code {exit_code}, first failed node {node or 'unknown'})",
        )

    def _check_life(self, diagnosis: Diagnosis, plan: list[str], exit_code: int) -> Diagnosis:
        """A step ended by a signal with every node healthy in Slurm's eyes: a node that died outright
        (slurmd and its tasks gone) looks exactly so until SlurmdTimeout. Hardware until shown otherwise:
        each node must run a trivial task within a few seconds."""
        dead = unanswering(self.client, self.reporter, self.job_id, plan, self.env, exit_code=exit_code)
        if not dead:
            return diagnosis
        self.capacity.mark_unanswering(dead)
        detail = "; ".join(
            f"{n}: ran no task within {LIVENESS_PROBE_S:g} s after the step died of a signal" for n in dead
        )
        return Diagnosis(Cause.HARDWARE, dead, detail, {n: "unanswering" for n in dead})


def first_failed_node(srun_errors: Sequence[str]) -> str | None:
    """The node of the first task srun reported ending badly ("srun: error: n2: task 1: Exited ...")."""
    for line in srun_errors:
        m = TASK_END_LINE.match(line)
        if m:
            return line[len("srun: error: ") :].split(":", 1)[0]
    return None
