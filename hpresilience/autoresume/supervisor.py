"""The step supervisor behind `srun --auto-resume=1`: plan, launch, decide, recover, relaunch.

Each attempt reads the allocation from Slurm, plans the step's nodes (launch/plan.py) and runs the step
(launch/runner.py), whose detectors (watch/table.py) return the verdict that stopped it; what that means for the
job, and why the step ended, is decided after it (decide/verdicts.py, decide/ending.py). Every decision is one
JSON line (report.py); the state that must outlive a requeue is saved by job id (state.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import IO

from hpresilience.autoresume.decide.capacity import BatchHostLost, Capacity, NoReplacement
from hpresilience.autoresume.decide.classify import Cause, Diagnosis
from hpresilience.autoresume.decide.crashloop import CrashWatch, elsewhere
from hpresilience.autoresume.decide.ending import Ending
from hpresilience.autoresume.decide.policy import PolicyChoice, RestartPolicy
from hpresilience.autoresume.decide.preflight import Preflight
from hpresilience.autoresume.decide.requeue import choose_requeue_path, clear_requeue_marker, prepare_requeue
from hpresilience.autoresume.decide.verdicts import KIND_OF, OUTCOME_OF, Outcome, after_diagnosis, is_move
from hpresilience.autoresume.launch.plan import AttemptLaunch, master_port, plan_nodes
from hpresilience.autoresume.launch.runner import StepRunner
from hpresilience.autoresume.launch.stepops import TASK_MARKER, StepOps, user_labels
from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import JobIdentity, WrapperState, WrapperStateStore
from hpresilience.autoresume.watch.base import AttemptResult, StopRequest
from hpresilience.autoresume.watch.evidence import HangInvestigator
from hpresilience.autoresume.watch.feed import RuleFeed
from hpresilience.autoresume.watch.nodewatch import NodeWatch
from hpresilience.autoresume.watch.replay import LossReplay, report_replay
from hpresilience.autoresume.watch.rules import RuleSet
from hpresilience.autoresume.watch.table import DETECTORS, DetectorFactory, WatchContext, build_detectors
from hpresilience.errors import ConfigError, HPResilienceError, JobFailed
from hpresilience.goodput.ledgerfile import attempt_record, close_ledger
from hpresilience.log import get_logger
from hpresilience.registry import Registry
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.jobs import job_identity_details

log = get_logger("hpresilience.autoresume")
# Signals that end the supervision (scancel, preemption's SIGTERM, Ctrl-C): forwarded, then no relaunch.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
NUDGE_SIGNAL = signal.SIGWINCH  # slurm/notice.nudge
# Signals passed on to the step and otherwise ignored (preemption notices sent with --signal=B:USR1@T).
FORWARD_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
EXIT_REQUEUE_DID_NOT_STOP = 1


class Supervisor:
    def __init__(
        self,
        opts: WrapperOptions,
        client: SlurmClient,
        env: Mapping[str, str] | None = None,
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        detectors: Registry[DetectorFactory] | None = None,
    ) -> None:
        self.opts = opts
        self.client = client
        self.env = dict(os.environ if env is None else env)
        self.job_id = opts.job_id
        self.store = WrapperStateStore(opts.state_dir, opts.job_id)
        self.details = job_identity_details(client, opts.job_id)
        self.requeue_path = choose_requeue_path(client, self.details)  # Slurm's expedited requeue, or ours
        self.identity = JobIdentity(
            cluster=self.env.get("SLURM_CLUSTER_NAME", ""),
            job_id=opts.job_id,
            submit_time=self.details.get("SubmitTime", ""),
            restart_count=_int_env(self.env, "SLURM_RESTART_COUNT"),
        )
        self.state: WrapperState = self.store.load(self.identity)
        self.reporter = Reporter(self.store, opts.job_id, opts.metrics_path)
        self.policy = self._load_policy()
        self.ops = StepOps(client, opts.job_id, self.env, self.reporter, opts.script_timeout_s)
        # A failed node released while its slurmstepd still ends the old step, and repaired fast, kills the next
        # step sent to it once back in the job: it leaves the job only once that step is gone there.
        self.capacity = Capacity(
            client,
            opts.job_id,
            self.state,
            self.reporter,
            grow=opts.grow,
            replace_timeout_s=opts.replace_timeout_s,
            min_nodes=opts.min_nodes,
            settle=self.ops.settle,
        )
        labels_ours = opts.watch.label_tasks and not user_labels(opts.srun.passthrough)
        self.replay = LossReplay(opts.watch.restore_loss_steps, opts.watch.restore_loss_tolerance)
        self.feed = RuleFeed(
            RuleSet(
                opts.run_policy.log_monitoring_configuration,
                strip_task_label=labels_ours,
                max_line_chars=opts.max_line_bytes,
            ),
            replay=self.replay,
        )
        self.stop_request = StopRequest()
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
        self.nodewatch = NodeWatch(client, opts.job_id, opts.full_node_check_s)
        watch = WatchContext(
            opts=opts,
            client=client,
            reporter=self.reporter,
            progress=self.progress,
            feed=self.feed,
            env=self.env,
            investigator=self.investigator,
            nodewatch=self.nodewatch,
            labels_ours=labels_ours,
            unhealthy=self.capacity.unhealthy,
            back_in_service=self.capacity.back_in_service,
            state=self.state,
        )
        self.steps = StepRunner(
            opts,
            client,
            self.feed,
            self.reporter,
            self.env,
            stdout or sys.stdout.buffer,
            stderr or sys.stderr.buffer,
            self.ops,
            build_detectors(watch, detectors or DETECTORS),
            self.stop_request,
            self.progress,
        )
        self.ending = Ending(
            opts,
            client,
            self.reporter,
            self.progress,
            self.feed,
            self.capacity,
            self.investigator.root,
            self.env,
            self.stop_request,
        )
        self.crashes = CrashWatch(opts.watch, self.state, self.reporter, self.progress, self.feed)
        self.preflight = Preflight(client, self.job_id, opts, self.reporter, self.ops.env, self.capacity.recover)
        self.exclude, self.size = set[str](), 0  # exclude: stragglers out at the next relaunch (exclude_stragglers)

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
            self.nodewatch.on_nudge()
            return
        if signum in STOP_SIGNALS:
            self.stop_request.set(signum)
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
            **self.requeue_path.fields(),
        )
        clear_requeue_marker(self.client, self.job_id, self.identity.restart_count, self.details)
        try:
            return self._run()
        finally:
            self.steps.ensure_stopped()
            self._save()
            self.reporter.flush_metrics()
            close_ledger(self.job_id, self.store.events_path, self.steps.stdout)

    def _run(self) -> int:
        previous = list(self.state.last_nodes) or None
        failed_at: float | None = None
        plan: list[str] | None = None
        while True:
            if self.stop_request.signum:
                return 128 + self.stop_request.signum
            job = self.client.job(self.job_id)
            size = self.size or self.opts.step_size(len(job.nodes))
            self.size = size
            plan = plan or plan_nodes(job.nodes, size, self.capacity.unhealthy(job), previous)
            try:  # a new node set is checked first (decide/preflight.py): nothing is run for the same nodes
                plan = self.preflight.vet(plan or self.capacity.recover([], previous or [], size), previous, size)
            except NoReplacement as err:
                return self._no_replacement(str(err), batch_host=isinstance(err, BatchHostLost))
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
            report_replay(self.reporter, launch.attempt, self.replay.new_attempt())
            if self.stop_request.signum:
                stopped_by = signal.Signals(self.stop_request.signum).name
                self.reporter.decision("supervisor_stopped", signal=stopped_by, exit_code=result.exit_code)
                return 128 + self.stop_request.signum
            failed_at = result.failed_at
            try:
                after = self._after(result, launch, plan, size)
            except NoReplacement as err:
                return self._no_replacement(str(err), batch_host=isinstance(err, BatchHostLost))
            if isinstance(after, int):
                return after
            previous, plan = plan, after

    def _after(self, result: AttemptResult, launch: AttemptLaunch, plan: list[str], size: int) -> int | list[str]:
        """What the ended attempt means (decide/verdicts.py): the job's exit code, or the next attempt's nodes."""
        self.exclude |= set(result.leave_out)  # exclude_stragglers: they leave at the next relaunch
        if is_move(result):
            return self._move(result, plan, size)  # planned: not a fault, not counted against the restart budget
        exit_code = self.ending.exit_code(result)
        if result.unanswering:  # kept out of the step, left in the job (capacity.mark_unanswering says why)
            self.capacity.mark_unanswering(result.unanswering)
        crash = self.crashes.crash(exit_code, plan, launch.attempt)
        self.ending.hold_marks = self.crashes.repeating(crash)  # a repeated crash marks no node (crashloop.py)
        diagnosis = self.ending.diagnose(exit_code, plan, result, launch.attempt)
        if after_diagnosis(diagnosis.cause) is Outcome.FINISH:
            self.state.finished, self.state.exit_code = True, 0
            self.reporter.decision("job_step_succeeded", attempt=launch.attempt)
            return 0
        mark = self.ending.mark_suspect if self.opts.watch.mark_suspect_nodes else None
        diagnosis, judged = self.crashes.judge(crash, diagnosis, mark)
        self.reporter.decision(
            "fault_seen",
            cause=diagnosis.cause.value,
            attempt=launch.attempt,
            exit_code=exit_code,
            nodes=",".join(diagnosis.bad_nodes) or None,
            detail=diagnosis.detail,
        )
        # No task of this attempt may train on beside the next one, or beside a requeued job.
        self.ops.reap([n for n in plan if n not in diagnosis.bad_nodes])
        if diagnosis.cause is Cause.CRASH_LOOP or judged.stop_code is not None:
            return self._give_up(diagnosis, exit_code, diagnosis.detail)
        decision = self.policy.decide(KIND_OF[diagnosis.cause], exit_code)
        self.reporter.decision(
            "policy_decided",
            action=decision.choice.value,
            reason=decision.reason,
            detail=decision.detail,
            restarts_in_window=decision.restarts_in_window,
        )
        outcome = OUTCOME_OF[decision.choice]
        if outcome is Outcome.GIVE_UP:
            return self._give_up(diagnosis, exit_code, decision.detail)
        if outcome is Outcome.REQUEUE:
            return self._requeue(decision.detail)
        bad = list(diagnosis.bad_nodes) if diagnosis.cause is Cause.HARDWARE else []
        leave = [n for n in plan if n in self.exclude and n not in bad]
        if leave:  # exclude_stragglers: a straggler leaves at the next relaunch, whatever its cause
            self.reporter.decision("straggler_excluded", nodes=",".join(leave))
            self.exclude -= set(leave)
        if bad or leave:
            plan = self.capacity.recover([*bad, *leave], plan, size)
        elif diagnosis.cause is Cause.RERUN or judged.move:  # on other hardware, where the allocation has it
            job = self.client.job(self.job_id)
            moved = elsewhere(job.nodes, plan, self.capacity.unhealthy(job), crash.first_node)
            if moved != plan:
                self.reporter.decision("step_moved_off_crash", nodes_from=",".join(plan), nodes=",".join(moved))
                plan = moved
        self.state.count_restart(diagnosis.cause.value)
        self.reporter.count_restart(diagnosis.cause.value)
        cause = diagnosis.cause.value
        self.reporter.decision("step_relaunching", cause=cause, nodes=",".join(plan), restarts=self.state.restarts)
        return plan

    def _move(self, result: AttemptResult, plan: list[str], size: int) -> list[str]:
        self.ops.reap([n for n in plan if n not in result.leaving])
        target = result.target
        if target is None:  # off drained nodes: to a spare, a grown job, or short (min_nodes)
            target = self.capacity.recover(result.leaving, plan, size)
        self.capacity.settle_returning(target, plan)
        self.reporter.decision(
            "step_moved",
            why=result.moved,
            nodes=",".join(target),
            nodes_now=len(target),
            nodes_requested=size,
            exit_code=result.exit_code,
        )
        return target

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
            action=decision.choice.value,
            detail=decision.detail,
            batch_host=batch_host or None,
        )
        if decision.choice is PolicyChoice.FULL_RESTART:
            return self._requeue(f"{why}; {decision.detail}")
        self.state.finished, self.state.exit_code = True, 1
        raise JobFailed(f"job {self.job_id}: {why}; {decision.detail}")

    def _requeue(self, why: str) -> int:
        self.state.requeues += 1
        self._save()
        via = self.requeue_path.via  # Slurm's own expedited requeue, or the controller's release
        self.reporter.decision("job_requeue_requested", why=why, requeues=self.state.requeues, via=via)
        prepare_requeue(self.client, self.job_id, self.reporter, self.requeue_path)
        try:
            self.client.requeue(self.job_id)
        except HPResilienceError as err:
            self.state.finished, self.state.exit_code = True, 1
            raise JobFailed(f"job {self.job_id}: requeue refused ({err}); submit with --requeue to allow it") from None
        # Slurm now ends this batch script; if it does not, say so rather than pretend the job went on.
        deadline = time.monotonic() + self.opts.requeue_wait_s
        while time.monotonic() < deadline and not self.stop_request.signum:
            time.sleep(0.2)
        if self.stop_request.signum:
            return 128 + self.stop_request.signum
        raise JobFailed(f"job {self.job_id} was requeued but this batch script kept running", EXIT_REQUEUE_DID_NOT_STOP)


def _int_env(env: Mapping[str, str], key: str) -> int:
    try:
        return max(0, int(env.get(key, "0") or "0"))
    except ValueError:
        return 0
