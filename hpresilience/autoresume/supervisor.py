"""The step supervisor behind `srun --auto-resume=1`: launch, watch, classify, recover, relaunch.

Each attempt reads the allocation from Slurm, plans the step's nodes (plan.py), launches srun with an
explicit node list and a fresh environment, and watches three things until the step ends: its exit,
the log rules, and (about once a second) the Slurm state of its nodes. A node marked bad while the step
runs is not waited for: the step is killed at once, because on a real cluster its survivors would hang
in a collective until a timeout. Every decision is one JSON line (report.py); the state that must
outlive a requeue is saved by job id (state.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import IO

from hpresilience.autoresume.decide.capacity import BatchHostLost, Capacity, NoReplacement
from hpresilience.autoresume.decide.classify import Cause, Diagnosis, classify, node_is_bad
from hpresilience.autoresume.decide.policy import Action, FailureKind, RestartPolicy
from hpresilience.autoresume.launch.plan import AttemptLaunch, master_port, plan_nodes
from hpresilience.autoresume.launch.steps import TASK_MARKER, StepRunner, user_labels
from hpresilience.autoresume.launch.stream import RuleFeed
from hpresilience.autoresume.ledger import render
from hpresilience.autoresume.ledgerfile import attempt_record, write_ledger
from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import JobIdentity, StateStore, WrapperState
from hpresilience.autoresume.watch.collective import CollectiveBudget
from hpresilience.autoresume.watch.evidence import HangInvestigator
from hpresilience.autoresume.watch.flightrec import read_dumps, wavefront
from hpresilience.autoresume.watch.hang import Attribution
from hpresilience.autoresume.watch.rules import LogState, RuleSet, RuleTripped
from hpresilience.autoresume.watch.stragglers import Straggler
from hpresilience.errors import ConfigError, HPResilienceError, JobFailed
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.jobs import (
    has_requeue_marker,
    job_comment,
    job_identity_details,
    set_job_comment,
    with_requeue_marker,
)
from hpresilience.slurm.models import Node
from hpresilience.slurm.srun import TASK_END_LINE, application_exit_code
from hpresilience.slurm.steps import nodes_answering

log = get_logger("hpresilience.autoresume")
# Signals that end the supervision (scancel, preemption's SIGTERM, Ctrl-C): forwarded, then no relaunch.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
NUDGE_SIGNAL = signal.SIGWINCH  # slurm/notice.nudge
# Signals passed on to the step and otherwise ignored (preemption notices sent with --signal=B:USR1@T).
FORWARD_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
KIND_OF = {
    Cause.HARDWARE: FailureKind.NODE_FAULT,
    Cause.HANG: FailureKind.RULE_TRIPPED,
    Cause.SLOW: FailureKind.RULE_TRIPPED,
    Cause.COLLECTIVE: FailureKind.RULE_TRIPPED,
    Cause.APPLICATION: FailureKind.APPLICATION_ERROR,
}
EXIT_REQUEUE_DID_NOT_STOP = 1
# A step that ended by a signal may have lost a node that Slurm still calls healthy (slurmd dead, nobody
# marked it; Slurm notices after SlurmdTimeout, 300 s by default): every node must answer within this.
LIVENESS_PROBE_S = 3.0


class Supervisor:
    def __init__(
        self,
        opts: WrapperOptions,
        client: SlurmClient,
        env: Mapping[str, str] | None = None,
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
    ) -> None:
        self.opts = opts
        self.client = client
        self.env = dict(os.environ if env is None else env)
        self.job_id = opts.job_id
        self.store = StateStore(opts.state_dir, opts.job_id)
        self.details = job_identity_details(client, opts.job_id)
        self.identity = JobIdentity(
            cluster=self.env.get("SLURM_CLUSTER_NAME", ""),
            job_id=opts.job_id,
            submit_time=self.details.get("SubmitTime", ""),
            restart_count=_int_env(self.env, "SLURM_RESTART_COUNT"),
        )
        self.state: WrapperState = self.store.load(self.identity)
        self.reporter = Reporter(self.store, opts.job_id, opts.metrics_path)
        self.policy = self._load_policy()
        self.capacity = Capacity(
            client,
            opts.job_id,
            self.state,
            self.reporter,
            grow=opts.grow,
            replace_timeout_s=opts.replace_timeout_s,
            min_nodes=opts.min_nodes,
        )
        labels_ours = opts.watch.label_tasks and not user_labels(opts.srun.passthrough)
        self.feed = RuleFeed(
            RuleSet(
                opts.run_policy.log_monitoring_configuration,
                strip_task_label=labels_ours,
                max_line_chars=opts.max_line_bytes,
            )
        )
        self.stop_signal: int | None = None
        # The one progress stream of the step: hangs, stragglers (and later the ledger) read it.
        self.progress = ProgressStream()
        self.investigator = HangInvestigator(
            client,
            opts.job_id,
            opts.state_dir / f"{opts.job_id}.evidence",
            self.progress,
            self.reporter,
            self.env,
            f"{TASK_MARKER}={opts.job_id}",
            opts.watch.hang_evidence_timeout_s,
        )
        self.collective = CollectiveBudget(
            opts.watch.collective_retries, opts.run_policy.restart_policy.eval_period_seconds
        )
        self.exclude: set[str] = set()  # stragglers to leave out at the next relaunch (exclude_stragglers)
        self.steps = StepRunner(
            opts,
            client,
            self.feed,
            self.reporter,
            self.env,
            stdout or sys.stdout.buffer,
            stderr or sys.stderr.buffer,
            should_stop=lambda: self.stop_signal is not None,
            progress=self.progress,
            on_hang=self.investigator,
            on_straggler=self._straggler,
            tasks_alive=self.investigator.tasks_alive,
            should_move=self._should_move,
        )
        # A failed node released while its slurmstepd still ends the old step, and repaired fast, kills the next
        # step sent to it once back in the job: it leaves the job only once that step is gone there.
        self.capacity.settle = self.steps.settle
        self.moving_to: list[str] | None = None  # the plan a planned move goes to (grow back)
        self.size = 0

    # -- state across requeues -----------------------------------------------------------------------
    def _load_policy(self) -> RestartPolicy:
        restart_count = _int_env(self.env, "SLURM_RESTART_COUNT")
        policy = RestartPolicy(self.opts.run_policy)
        if self.state.policy:
            try:
                policy = RestartPolicy.from_dict(self.opts.run_policy, self.state.policy)
            except ConfigError as err:
                self.reporter.decision("policy_state_reset", error=str(err))
        policy.observe_job_start(restart_count)
        if restart_count != self.state.slurm_restart_count:
            # A requeued job runs on a fresh allocation: what we knew about the old one no longer holds.
            self.state.slurm_restart_count = restart_count
            self.state.resized = False
            self.state.resize_refused = False
            self.state.kept_out = []
            self.state.last_nodes = []
        for cause, count in self.state.restarts_by_cause.items():
            self.reporter.restarts.labels(str(self.job_id), cause).inc(count)
        return policy

    def _save(self) -> None:
        self.state.policy = self.policy.to_dict()
        try:
            self.store.save(self.state)
        except OSError as err:
            log.warning("state_file_write_failed", path=str(self.store.path), error=str(err))

    # -- signals -------------------------------------------------------------------------------------
    def on_signal(self, signum: int) -> None:
        """Called from the signal handler: records a stop or forwards a notice; the loop does the rest."""
        if signum == NUDGE_SIGNAL:  # the controller's nudge: for us alone, never passed on to the tasks
            self.steps.watch.on_nudge()
            return
        if signum in STOP_SIGNALS:
            self.stop_signal = self.stop_signal or signum
        self.steps.forward(signum)

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> int:
        if self.store.set_aside is not None:
            self.reporter.decision("state_file_of_another_job", **self.store.set_aside)
        self.reporter.decision(
            "supervisor_started",
            attempts_so_far=self.state.attempts,
            slurm_restart_count=self.state.slurm_restart_count,
            cluster=self.identity.cluster or None,
            submit_time=self.identity.submit_time or None,
            rules=self.feed.rules.names or None,
            command=" ".join(self.opts.srun.command),
        )
        self._clear_requeue_marker()
        try:
            return self._run()
        finally:
            self.steps.ensure_stopped()
            self._save()
            self.reporter.flush_metrics()
            self._close_ledger()

    def _run(self) -> int:
        previous = list(self.state.last_nodes) or None
        failed_at: float | None = None
        plan: list[str] | None = None
        while True:
            if self.stop_signal:
                return 128 + self.stop_signal
            job = self.client.job(self.job_id)
            size = self.size or self.opts.step_size(len(job.nodes))
            self.size = size
            if plan is None:
                plan = plan_nodes(job.nodes, size, self.capacity.unhealthy(job), previous)
            if plan is None:
                try:
                    plan = self.capacity.recover([], previous or [], size)
                except NoReplacement as err:
                    return self._no_replacement(str(err))
            launch = self._launch_for(plan, job.nodes, size)
            self.state.attempts += 1
            self.state.last_nodes = list(plan)
            self.reporter.set_attempts(self.state.attempts)
            self._save()
            result = self.steps.run_attempt(
                launch, self.state.restarts, failed_at, self.investigator.attempt_dir(launch.attempt)
            )
            self.reporter.decision(
                "attempt_ended", **attempt_record(self.progress, launch.attempt, result.failed_at, result.exit_code)
            )
            if self.stop_signal:
                self.reporter.decision(
                    "supervisor_stopped", signal=signal.Signals(self.stop_signal).name, exit_code=result.exit_code
                )
                return 128 + self.stop_signal
            failed_at = result.failed_at
            if result.moved is not None and (self.moving_to is not None or result.leaving):
                # A planned move: not a fault, not counted against the restart budget.
                self.steps.reap([n for n in plan if n not in result.leaving])
                target = self.moving_to
                if target is None:  # off drained nodes: to a spare, a grown job, or short (min_nodes)
                    try:
                        target = self.capacity.recover(result.leaving, plan, size)
                    except NoReplacement as err:
                        return self._no_replacement(str(err), batch_host=isinstance(err, BatchHostLost))
                previous, plan, self.moving_to = plan, target, None
                self.reporter.decision(
                    "step_moved",
                    why=result.moved,
                    nodes=",".join(plan),
                    nodes_now=len(plan),
                    nodes_requested=size,
                    exit_code=result.exit_code,
                )
                continue
            exit_code = result.exit_code
            if result.unanswering:  # kept out of the step, left in the job (capacity.mark_unanswering says why)
                self.capacity.mark_unanswering(result.unanswering)
            if result.trip is None and not result.blamed:  # the step ended by itself, not by our hand
                exit_code = application_exit_code(result.exit_code, self.feed.srun_errors)
                if exit_code != result.exit_code:
                    self.reporter.decision(
                        "step_exit_code_from_first_task", srun_exit_code=result.exit_code, exit_code=exit_code
                    )
            diagnosis = self._diagnose(exit_code, plan, result.blamed, result.trip, result.hang)
            if diagnosis.cause is Cause.NONE:
                self.state.finished, self.state.exit_code = True, 0
                self.reporter.decision("job_step_succeeded", attempt=launch.attempt)
                return 0
            self.reporter.decision(
                "fault_seen",
                cause=diagnosis.cause.value,
                attempt=launch.attempt,
                exit_code=exit_code,
                nodes=",".join(diagnosis.bad_nodes) or None,
                detail=diagnosis.detail,
            )
            # No task of this attempt may train on beside the next one, or beside a requeued job.
            self.steps.reap([n for n in plan if n not in diagnosis.bad_nodes])
            decision = self.policy.decide(KIND_OF[diagnosis.cause], exit_code)
            self.reporter.decision(
                "policy_decided",
                action=decision.action.value,
                reason=decision.reason,
                detail=decision.detail,
                restarts_in_window=decision.restarts_in_window,
            )
            if decision.action is Action.GIVE_UP:
                return self._give_up(diagnosis, exit_code, decision.detail)
            if decision.action is Action.FULL_RESTART:
                return self._requeue(decision.detail)
            previous = plan
            bad = list(diagnosis.bad_nodes) if diagnosis.cause is Cause.HARDWARE else []
            leave = [n for n in plan if n in self.exclude and n not in bad]
            if leave:  # exclude_stragglers: a straggler leaves at the next relaunch, whatever its cause
                self.reporter.decision("straggler_excluded", nodes=",".join(leave))
                self.exclude -= set(leave)
            if bad or leave:
                try:
                    plan = self.capacity.recover([*bad, *leave], plan, size)
                except NoReplacement as err:
                    return self._no_replacement(str(err), batch_host=isinstance(err, BatchHostLost))
            self.state.count_restart(diagnosis.cause.value)
            self.reporter.count_restart(diagnosis.cause.value)
            self.reporter.decision(
                "step_relaunching", cause=diagnosis.cause.value, nodes=",".join(plan), restarts=self.state.restarts
            )

    def _should_move(self, launch: AttemptLaunch) -> str | None:
        """Polled with the node checks while the step runs: why to move it now (planned), else None."""
        if len(launch.nodes) >= launch.requested or self.opts.grow_back == "never":
            return None
        try:
            plan = self.capacity.back_in_service(launch.requested, launch.nodes)
        except HPResilienceError as err:
            log.warning("slurm_poll_failed", error=str(err)[:300])
            return None
        if plan is None:
            return None
        self.moving_to = plan
        back = [n for n in plan if n not in launch.nodes]
        return f"grow back to {len(plan)} nodes: {','.join(back)} back in service"

    def _launch_for(self, plan: list[str], allocation: tuple[str, ...], size: int = 0) -> AttemptLaunch:
        attempt = self.state.attempts + 1
        first = self.client.node(plan[0])
        return AttemptLaunch(
            attempt=attempt,
            nodes=tuple(plan),
            allocation=tuple(allocation),
            master_addr=first.address or first.name,
            master_port=master_port(self.opts.master_port_base, self.opts.master_port_span, self.job_id, attempt),
            tasks_per_node=self.opts.srun.tasks_per_node(),
            job_marker=str(self.job_id),
            requested=size or len(plan),
        )

    def _diagnose(
        self,
        exit_code: int,
        plan: list[str],
        blamed: list[str],
        trip: RuleTripped | None,
        hang: Attribution | None = None,
    ) -> Diagnosis:
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
            fired = (Cause.SLOW if trip.state is LogState.SLOW else Cause.HANG, f"{trip.name}: {trip.detail}")
        elif hang is not None:
            fired = (Cause.HANG, "; ".join(s.why for s in hang.suspects)[:500] or "no rank or node stood out")
        diagnosis = classify(exit_code, plan, by_name, allocation, self.feed.srun_errors, fired, blamed)
        if diagnosis.cause is Cause.HANG and hang is not None:
            return self._hang_verdict(diagnosis, hang, plan)
        if diagnosis.cause is Cause.APPLICATION and self.progress.signatures():
            return self._collective(diagnosis, plan, exit_code)
        if diagnosis.cause is Cause.APPLICATION and exit_code > 128:
            return self._check_life(diagnosis, plan, exit_code)
        return diagnosis

    # -- sick, not dead --------------------------------------------------------------------------------
    def _hang_verdict(self, diagnosis: Diagnosis, hang: Attribution, plan: list[str]) -> Diagnosis:
        """An unambiguous culprit is marked for a reboot and swapped out like any bad node; otherwise the
        step goes again on the same nodes, and the events say why."""
        if hang.unambiguous and self.opts.watch.mark_suspect_nodes:
            node = hang.nodes[0]
            why = "; ".join(s.why for s in hang.suspects if s.node == node)
            if self._mark_suspect(node, f"hang: {why}", str(self.investigator.root)):
                return Diagnosis(Cause.HARDWARE, (node,), f"{node}: {why}", {node: why})
        self.reporter.decision(
            "hang_relaunch_same_nodes",
            nodes=",".join(plan),
            why="evidence is ambiguous" if not hang.unambiguous else "marking is off or failed",
            suspects=",".join(hang.nodes) or None,
        )
        return diagnosis

    def _mark_suspect(self, node: str, why: str, evidence: str) -> bool:
        reason = f"Action:Reboot [hpr-autoresume job {self.job_id}] {why} evidence={evidence}"
        reason = reason.replace('"', "'")[:400]
        try:
            self.client.set_node_state([node], "fail", reason)
        except HPResilienceError as err:
            self.reporter.decision("suspect_mark_failed", node=node, error=str(err)[:300])
            return False
        self.reporter.decision("suspect_node_marked", node=node, action="reboot", reason=reason)
        return True

    def _collective(self, diagnosis: Diagnosis, plan: list[str], exit_code: int) -> Diagnosis:
        """A collective timeout or abort: wait a settle window for a verdict on the nodes (the agent may
        not have marked a failing node yet), then relaunch on the same nodes within collective_retries."""
        sig = self.progress.signatures()[0]
        settle = self.opts.watch.collective_settle_s
        # NCCL dumps its flight recorder on a watchdog timeout (TORCH_NCCL_DUMP_ON_TIMEOUT, steps.py) into the
        # attempt's evidence directory: the ranks that never entered the collective.
        front = wavefront(
            read_dumps(self.investigator.root / f"attempt-{self.state.attempts}"), world=sorted(self.progress.ranks())
        )
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
        while time.monotonic() < deadline and not self.stop_signal:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            try:
                bad = [n.name for n in self.client.known_nodes(plan) if node_is_bad(n)]
            except HPResilienceError:
                continue
            if bad:
                return Diagnosis(
                    Cause.HARDWARE, tuple(bad), "; ".join(f"{n}: marked during the settle window" for n in bad)
                )
        node = _first_failed_node(self.feed.srun_errors) or self.progress.node_of_task(sig.task)
        if node is not None and node in plan and self.collective.implicate(node) >= 2:
            why = f"implicated in {self.collective.implicated[node]} collective failures ({sig.kind})"
            if self.opts.watch.mark_suspect_nodes and self._mark_suspect(node, why, sig.line[:120]):
                return Diagnosis(Cause.HARDWARE, (node,), f"{node}: {why}", {node: why})
        if not self.collective.allow():
            self.reporter.decision("collective_retries_exhausted", retries=self.opts.watch.collective_retries)
            return diagnosis
        return Diagnosis(
            Cause.COLLECTIVE,
            (),
            f"{sig.kind}: {sig.line[:200]} (exit code {exit_code}, first failed node {node or 'unknown'})",
        )

    def _straggler(self, launch: AttemptLaunch, s: Straggler) -> None:
        self.reporter.straggler(s.node, s.ratio)
        self.reporter.decision(
            "straggler_detected",
            node=s.node,
            ratio=s.ratio,
            slow_windows=s.slow_windows,
            windows=s.windows,
            fraction=self.opts.watch.straggler_fraction,
            exclude=self.opts.watch.exclude_stragglers,
        )
        if not self.opts.watch.exclude_stragglers:
            return
        self.exclude.add(s.node)
        try:  # a hot spare at hand: swap now (the step stops as for a tripped rule); else at the next relaunch
            job = self.client.job(self.job_id)
            bad = self.capacity.unhealthy(job)
        except HPResilienceError:
            return
        spares = [n for n in job.nodes if n not in launch.nodes and n not in bad]
        if spares:
            self.reporter.decision("straggler_swap_now", node=s.node, spare=spares[0])
            self.steps.pending_trip = RuleTripped(
                "straggler",
                LogState.SLOW,
                f"{s.node} is a straggler ({s.ratio:g} x the other nodes' step time)",
                time.monotonic(),
            )

    def _check_life(self, diagnosis: Diagnosis, plan: list[str], exit_code: int) -> Diagnosis:
        """A step ended by a signal with every node healthy in Slurm's eyes: a node that died outright
        (slurmd and its tasks gone) looks exactly so until SlurmdTimeout. Hardware until shown otherwise:
        each node must run a trivial task within a few seconds."""
        started = time.monotonic()
        answers = nodes_answering(self.client, self.job_id, plan, self.env, LIVENESS_PROBE_S)
        dead = tuple(n for n in plan if not answers.get(n, False))
        self.reporter.decision(
            "nodes_probed",
            nodes=",".join(plan),
            unanswering=",".join(dead) or None,
            exit_code=exit_code,
            took_s=round(time.monotonic() - started, 3),
        )
        if not dead:
            return diagnosis
        self.capacity.mark_unanswering(dead)
        detail = "; ".join(
            f"{n}: ran no task within {LIVENESS_PROBE_S:g} s after the step died of a signal" for n in dead
        )
        return Diagnosis(Cause.HARDWARE, dead, detail, {n: "unanswering" for n in dead})

    # -- endings -------------------------------------------------------------------------------------
    def _give_up(self, diagnosis: Diagnosis, exit_code: int, why: str) -> int:
        code = exit_code if exit_code > 0 else 1
        self.state.finished, self.state.exit_code = True, code
        self.reporter.decision("job_step_given_up", cause=diagnosis.cause.value, exit_code=code, why=why)
        return code

    def _no_replacement(self, why: str, batch_host: bool = False) -> int:
        decision = self.policy.no_replacement(self.opts.fallback)
        self.reporter.decision(
            "no_replacement",
            why=why,
            action=decision.action.value,
            detail=decision.detail,
            batch_host=batch_host or None,
        )
        if decision.action is Action.FULL_RESTART:
            return self._requeue(f"{why}; {decision.detail}")
        self.state.finished, self.state.exit_code = True, 1
        raise JobFailed(f"job {self.job_id}: {why}; {decision.detail}")

    def _requeue(self, why: str) -> int:
        self.state.requeues += 1
        self._save()
        self.reporter.decision("job_requeue_requested", why=why, requeues=self.state.requeues)
        self._mark_for_release()
        try:
            self.client.requeue(self.job_id)
        except HPResilienceError as err:
            self.state.finished, self.state.exit_code = True, 1
            raise JobFailed(f"job {self.job_id}: requeue refused ({err}); submit with --requeue to allow it") from None
        # Slurm now ends this batch script; if it does not, say so rather than pretend the job went on.
        deadline = time.monotonic() + self.opts.requeue_wait_s
        while time.monotonic() < deadline and not self.stop_signal:
            time.sleep(0.2)
        if self.stop_signal:
            return 128 + self.stop_signal
        raise JobFailed(f"job {self.job_id} was requeued but this batch script kept running", EXIT_REQUEUE_DID_NOT_STOP)

    def _close_ledger(self) -> None:
        """Write `<job>.ledger.json` beside the events; when the job ends here (not a requeue), print its
        summary into the job's output. A ledger that cannot be written never changes the job's outcome."""
        try:
            ledger = write_ledger(self.job_id, self.store.events_path)
        except (OSError, ValueError) as err:
            log.warning("ledger_write_failed", path=str(self.store.events_path), error=str(err)[:300])
            return
        if ledger.ended:
            try:
                self.steps.stdout.write(
                    ("[hpresilience] " + render(ledger).replace("\n", "\n[hpresilience] ") + "\n").encode()
                )
                self.steps.stdout.flush()
            except (OSError, ValueError):
                pass  # the job's output is gone; the ledger file holds the same

    # -- the requeue marker --------------------------------------------------------------------------
    def _mark_for_release(self) -> None:
        """Tell the controller (root) that this requeue is ours, so it starts the job again at once instead
        of after Slurm's hold: a word in the job's comment, which survives the requeue."""
        try:
            comment = job_comment(self.client, self.job_id)  # the comment alone, byte for byte
            set_job_comment(self.client, self.job_id, with_requeue_marker(comment, True))
        except HPResilienceError as err:
            self.reporter.decision("requeue_marker_not_set", error=str(err)[:300])

    def _clear_requeue_marker(self) -> None:
        # Only a requeued run can carry the marker. The one-line form cuts a comment at its first `k=v` word,
        # so the comment is read alone (one job query) before it is looked at or written back.
        if self.identity.restart_count == 0 and not has_requeue_marker(self.details.get("Comment", "")):
            return
        try:  # the controller takes it off when it releases the job; this covers a job Slurm started anyway
            comment = job_comment(self.client, self.job_id)
            if has_requeue_marker(comment):
                set_job_comment(self.client, self.job_id, with_requeue_marker(comment, False))
        except HPResilienceError as err:
            log.warning("requeue_marker_not_cleared", error=str(err)[:300])


def _first_failed_node(srun_errors: list[str]) -> str | None:
    """The node of the first task srun reported ending badly ("srun: error: n2: task 1: Exited ...")."""
    for line in srun_errors:
        m = TASK_END_LINE.match(line)
        if m:
            return line[len("srun: error: ") :].split(":", 1)[0]
    return None


def _int_env(env: Mapping[str, str], key: str) -> int:
    try:
        return max(0, int(env.get(key, "0") or "0"))
    except ValueError:
        return 0
