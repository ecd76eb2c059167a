"""Running one attempt's step: launch, stream, watch rules and node states, stop it cleanly.

Stopping for a log rule or a signal is two-stage, as in hyperpodrun: the shutdown signal goes to the
step's tasks (`scancel --signal`, so srun itself keeps running and reports their exit), then after the
shutdown timeout the step is cancelled and srun is killed. A hardware fault skips the grace: the step is
lost to its collective anyway, so it is cancelled by id at once (`kill_now`). Whatever happens, no step of
ours outlives an attempt: after srun exits the wrapper looks for a step with its name and cancels it, and
before the next attempt `reap` kills any process of an earlier attempt still alive on the nodes (one that
left the step's process tracking, e.g. under proctrack/pgid), each reported as `stale_task_killed`.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO

from hpresilience.autoresume.decide.classify import node_is_bad
from hpresilience.autoresume.launch.plan import AttemptLaunch
from hpresilience.autoresume.launch.stream import Pump, RuleFeed
from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.flightrec import DUMP_PREFIX
from hpresilience.autoresume.watch.hang import Attribution, HangClock, HangDue
from hpresilience.autoresume.watch.nodewatch import NodeWatch
from hpresilience.autoresume.watch.rules import RuleTripped
from hpresilience.autoresume.watch.silence import SilenceWatch
from hpresilience.autoresume.watch.stragglers import Straggler, StragglerDetector
from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.notice import planned_move
from hpresilience.slurm.srun import StepProcess
from hpresilience.slurm.steps import (
    lingering_steps,
    named_steps,
    nodes_answering,
    reap_escaped_processes,
    reap_marked_processes,
    run_on_nodes,
    signal_step,
    write_notice,
)

log = get_logger("hpresilience.autoresume")
STEP_POLL_S = 0.1
# srun needs a moment after SIGTERM to tell slurmstepd to kill the tasks and to collect their exit.
SRUN_TERMINATE_GRACE_S = 10.0
# After its step is cancelled srun has nothing left to do but it waits for every node's report (up to
# KillWait + 2 s): it is killed after this.
SRUN_AFTER_CANCEL_S = 0.05
# A silent node must run a trivial task within this long (as the liveness probe after a step died of a signal).
SILENT_PROBE_S = 3.0
REAP_TIMEOUT_S = 15.0
# Longest wait for a node back in the job to finish ending the job's old step there (settle()).
SETTLE_S = 10.0
# Every task of an attempt carries this in its environment (value: the job id): `reap` finds them by it.
TASK_MARKER = "HPR_AUTORESUME_JOB"
MAX_DETECTION_AGE_S = 3600
# Before a silence becomes a hang the step's tasks are counted (one srun on its nodes, ~1 s): started this
# long before the deadline (at most a quarter of the threshold), so the declaration is not late for it.
LIVENESS_LEAD_S = 5.0


class TaskLook:
    """One count of the step's tasks, run in a thread ahead of a hang deadline; `deadline` is the one it is for."""

    def __init__(self, deadline: float, look: Callable[[], bool | None]) -> None:
        self.deadline = deadline
        self.alive: bool | None = None
        self._thread = threading.Thread(target=self._run, args=(look,), name="hpr-task-look", daemon=True)
        self._thread.start()

    def _run(self, look: Callable[[], bool | None]) -> None:
        try:
            self.alive = look()
        except Exception as err:  # noqa: BLE001 - an unknown answer is "alive": the hang path decides
            log.warning("step_task_count_failed", error=str(err)[:300])

    def result(self, timeout: float) -> bool | None:
        self._thread.join(timeout)
        return None if self._thread.is_alive() else self.alive


@dataclass
class AttemptResult:
    exit_code: int
    failed_at: float  # monotonic time the failure was seen (the kill decision, or srun's exit)
    blamed: list[str] = field(default_factory=list)
    trip: RuleTripped | None = None
    hang: Attribution | None = None  # the built-in hang detection stopped the step
    unanswering: list[str] = field(default_factory=list)  # silent nodes that did not answer a probe (silence.py)
    moved: str | None = None  # a planned move stopped the step (why): not a fault
    leaving: list[str] = field(default_factory=list)  # drained nodes the planned move takes the step off


def flight_recorder_env(env: dict[str, str], evidence_dir: str, entries: int) -> None:
    """PyTorch's flight recorder on, its dumps into the attempt's private evidence directory (flightrec.py);
    what the user set stays."""
    if entries <= 0:
        return
    for key in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env.setdefault(key, str(entries))
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    for key in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        env.setdefault(key, os.path.join(evidence_dir, DUMP_PREFIX))


def user_labels(passthrough: list[str]) -> bool:
    """Whether the user asked srun for task labels themselves (then they see them, as before)."""
    return any(w in ("-l", "--label") or w.startswith("--label=") for w in passthrough)


class StepRunner:
    def __init__(
        self,
        opts: WrapperOptions,
        client: SlurmClient,
        feed: RuleFeed,
        reporter: Reporter,
        env: Mapping[str, str],
        stdout: IO[bytes],
        stderr: IO[bytes],
        should_stop: Callable[[], bool] = lambda: False,
        progress: ProgressStream | None = None,
        on_hang: Callable[[AttemptLaunch, HangDue], Attribution] | None = None,
        on_straggler: Callable[[AttemptLaunch, Straggler], None] | None = None,
        tasks_alive: Callable[[AttemptLaunch], bool | None] | None = None,
        should_move: Callable[[AttemptLaunch], str | None] | None = None,
    ) -> None:
        self.opts = opts
        self.tasks_alive = tasks_alive
        self.task_look: TaskLook | None = None
        self.should_move = should_move
        self.notice_file = ""  # this attempt's notice file (run_attempt), and whether it was written
        self.draining: list[str] = []  # drained nodes of the step (planned move), and why
        self.drain_reason = ""
        self.noticed = False
        self.progress = progress or ProgressStream()
        self.on_hang = on_hang
        self.on_straggler = on_straggler
        w = opts.watch
        # Our own labels name each line's task; they are taken off again before the user sees the output.
        self.add_labels = w.label_tasks and not user_labels(opts.srun.passthrough)
        # The user's rules take precedence: with any rule configured the built-in hang detection is off.
        self.hang_clock = (
            HangClock(self.progress, w.hang_floor_s, w.hang_interval_factor, w.hang_first_step_s)
            if w.hang_detection and not opts.run_policy.log_monitoring_configuration
            else None
        )
        self.stragglers: StragglerDetector | None = None
        # Set from the loop's own callbacks (a straggler with a spare at hand): stop the step as a rule would.
        self.pending_trip: RuleTripped | None = None
        self.client = client
        self.feed = feed
        self.reporter = reporter
        self.env = dict(env)
        self.stdout = stdout
        self.stderr = stderr
        self.should_stop = should_stop
        self.current: StepProcess | None = None
        self.current_name = ""
        self._stopping = False
        self._progress_noted = False
        self.overlap = False  # a dead step of ours still holds resources: share them
        self.watch = NodeWatch(client, opts.job_id, opts.full_node_check_s)
        self.silence = SilenceWatch(w.silent_node_s if self.add_labels else 0.0)  # labels name a line's node

    def step_name(self, attempt: int) -> str:
        return f"hpr-autoresume-{self.opts.job_id}-{attempt}"

    # -- one attempt ---------------------------------------------------------------------------------
    def run_attempt(
        self, launch: AttemptLaunch, restarts: int, failed_at: float | None, evidence_dir: str = ""
    ) -> AttemptResult:
        env = launch.environment(self.env, restarts)
        env["HPR_HEARTBEAT_EVERY_S"] = f"{self.opts.watch.heartbeat_every_s:g}"
        if evidence_dir:
            env["HPR_EVIDENCE_DIR"] = evidence_dir
            flight_recorder_env(env, evidence_dir, self.opts.watch.flight_recorder_entries)
        # Where the notice of a planned move appears on every node: a new directory name per attempt, private to
        # the user (created 0700 only when the notice is written), under the node's TMPDIR.
        base = self.env.get("TMPDIR", "/tmp").rstrip("/") or "/tmp"
        self.notice_file = f"{base}/hpr-{os.getuid()}-{secrets.token_hex(8)}/notice"
        self.noticed = False
        env["HPR_NOTICE_FILE"] = self.notice_file
        if self.opts.pre_train_script:
            rc = self._script("pre_train", self.opts.pre_train_script, launch, env)
            if rc != 0:
                return AttemptResult(rc, time.monotonic())
        name = self.step_name(launch.attempt)
        passthrough = [*self.opts.srun.passthrough, *(["--label"] if self.add_labels else [])]
        argv = launch.srun_argv(
            self.opts.srun_bin,
            self.opts.job_id,
            name,
            passthrough,
            self.opts.srun.command,
            self.opts.srun.export,
            overlap=self.overlap,
        )
        self.feed.reset()
        self.pending_trip = None
        self.progress.reset([node for node in launch.nodes for _ in range(launch.tasks_per_node)])
        self.task_look = None
        if self.hang_clock is not None:
            self.hang_clock.reset()
        w = self.opts.watch
        self.stragglers = StragglerDetector(
            w.straggler_fraction, w.straggler_windows, w.straggler_window_s, self.progress.attempt_started
        )
        self.progress.listeners = [self.stragglers.add]
        self._stopping = False
        self._progress_noted = False
        step = StepProcess(argv, env)
        self.current, self.current_name = step, name
        self.reporter.decision(
            "attempt_started",
            attempt=launch.attempt,
            nodes=",".join(launch.nodes),
            master_addr=launch.master_addr,
            master_port=launch.master_port,
            step_name=name,
        )
        pumps = [
            Pump(
                step.stdout, self.stdout, self.feed, self.opts.max_line_bytes, "stdout", self.progress, self.add_labels
            ),
            Pump(
                step.stderr, self.stderr, self.feed, self.opts.max_line_bytes, "stderr", self.progress, self.add_labels
            ),
        ]
        for p in pumps:
            p.start()
        result = self._watch(step, launch, failed_at)
        for p in pumps:
            p.join(timeout=10.0)
        self.current = None
        self._sweep(name)
        if self.noticed:  # the notice directory goes with the attempt
            self._notice(launch, "", clear=True)
        if self.opts.post_train_script:
            self._script("post_train", self.opts.post_train_script, launch, env)
        return result

    def _watch(self, step: StepProcess, launch: AttemptLaunch, failed_at: float | None) -> AttemptResult:
        blamed: list[str] = []
        trip: RuleTripped | None = None
        hang: Attribution | None = None
        moved: str | None = None
        leaving: list[str] = []
        self.draining = []
        move_deadline: float | None = None
        decided_at: float | None = None
        next_poll = time.monotonic() + self.opts.poll_interval_s
        seen_running = failed_at is None
        unanswering: list[str] = []
        self.silence.reset()
        next_silence_check = time.monotonic() + 1.0
        while (rc := step.wait(STEP_POLL_S if decided_at is not None else self._until_next_look())) is None:
            now = time.monotonic()
            if self.should_stop():
                self.stop(step, self.opts.shutdown_signal, self.opts.shutdown_timeout_s)
                continue
            if move_deadline is not None and now >= move_deadline:
                move_deadline = None
                self.reporter.decision(
                    "step_move_overdue", grace_s=self.opts.watch.move_grace_s, attempt=launch.attempt
                )
                self.stop(step, self.opts.shutdown_signal, self.opts.shutdown_timeout_s)
                continue
            if decided_at is not None:
                continue
            for t in self.feed.tick():
                self.reporter.decision(
                    "rule_fired",
                    rule=t.rule,
                    state=t.state.value,
                    condition=t.name,
                    detail=t.detail,
                    action=t.action,
                    attempt=launch.attempt,
                )
                if t.action == "restart" and trip is None:
                    trip, decided_at = t, now
            if self.pending_trip is not None and trip is None:
                trip, decided_at, self.pending_trip = self.pending_trip, now, None
            if trip is not None:
                self.stop(step, self.opts.shutdown_signal, self.opts.shutdown_timeout_s)
                continue
            self._watch_stragglers(launch, now)
            self._note_first_progress(launch)
            due = self._hang_due(launch, now)
            if due is not None:
                decided_at = now
                hang = self.on_hang(launch, due) if self.on_hang is not None else Attribution()
                # A hung step cannot save or finish: no grace period.
                self.kill_now(step, f"no progress for {due.silent_s:.0f} s")
                continue
            if not seen_running and failed_at is not None:
                seen_running = self._check_running(failed_at)
            if now >= next_silence_check:
                next_silence_check = now + 1.0
                unanswering = self._silent_and_unanswering(launch, now)
                if unanswering:
                    blamed, decided_at = list(unanswering), now
                    self.kill_now(step, f"node(s) {','.join(unanswering)} silent and not answering")
                    continue
            if now >= next_poll or self.watch.nudged():  # a nudge: the controller just wrote a notice
                next_poll = now + self.opts.poll_interval_s
                blamed = self._bad_nodes(launch)
                if not blamed and self.draining and moved is None:
                    leaving = list(self.draining)
                    moved = f"node(s) {','.join(leaving)} drained: {self.drain_reason}"
                    decided_at = now
                    self.reporter.decision("step_move_decided", why=moved, attempt=launch.attempt)
                    self._notice(launch, moved)
                    move_deadline = now + self.opts.watch.move_grace_s
                elif blamed:
                    decided_at = now
                    # The survivors would sit in a collective until it times out: kill at once.
                    self.kill_now(step, f"node(s) {','.join(blamed)} marked bad")
                elif self.should_move is not None and (moved := self.should_move(launch)) is not None:
                    decided_at = now
                    self.reporter.decision("step_move_decided", why=moved, attempt=launch.attempt)
                    # The ranks save and exit at their next step (check_alive() turns False); the rest is bounded.
                    self._notice(launch, moved)
                    move_deadline = now + self.opts.watch.move_grace_s
        if not seen_running and failed_at is not None and decided_at is None:
            self._check_running(failed_at)
        return AttemptResult(rc, decided_at or time.monotonic(), blamed, trip, hang, unanswering, moved, leaving)

    def _silent_and_unanswering(self, launch: AttemptLaunch, now: float) -> list[str]:
        """Probe the nodes gone silent while the others print on (silence.py); those that run no task in time."""
        tasks = list(self.progress.tasks().values())  # each takes the stream's lock itself
        interval = self.progress.median_interval()
        self.silence.silent_s = max(self.opts.watch.silent_node_s, 3 * (interval or 0.0))
        suspects = self.silence.suspects(tasks, launch.nodes, now)
        if not suspects:
            return []
        started = time.monotonic()
        answers = nodes_answering(self.client, self.opts.job_id, suspects, self.env, SILENT_PROBE_S)
        dead = [n for n in suspects if not answers.get(n, False)]
        self.silence.answered([n for n in suspects if n not in dead], tasks, now)
        self.reporter.decision(
            "silent_nodes_probed",
            nodes=",".join(suspects),
            unanswering=",".join(dead) or None,
            silent_s=round(self.silence.silent_s, 1),
            took_s=round(time.monotonic() - started, 3),
        )
        return dead

    def _until_next_look(self) -> float:
        """The loop's wait: a poll tick, but never past the hang deadline or the task count before it."""
        clock = self.hang_clock
        deadline = clock.deadline() if clock is not None else None
        if clock is None or deadline is None:
            return STEP_POLL_S
        ahead = deadline - time.monotonic()
        lead = self._lead()
        if (
            ahead > lead
            and self.tasks_alive is not None
            and not clock.rechecking()
            and (self.task_look is None or self.task_look.deadline != deadline)
        ):
            ahead -= lead
        return min(STEP_POLL_S, max(0.0, ahead))

    def _lead(self) -> float:
        limit = self.hang_clock.threshold() if self.hang_clock is not None else None
        return min(LIVENESS_LEAD_S, (limit or 0.0) / 4)

    def _hang_due(self, launch: AttemptLaunch, now: float) -> HangDue | None:
        """A hang is due at the clock's deadline, if the step still has tasks then. Their count starts a little
        ahead; a step whose tasks have all ended is not hung but over (its srun waits on a process that escaped
        it and holds its output, e.g. under proctrack/pgid): those are reaped and srun ends on its own."""
        if self.hang_clock is None:
            return None
        deadline = self.hang_clock.deadline()
        if deadline is None:
            return None
        look_fn = self.tasks_alive
        if (
            look_fn is not None
            and now >= deadline - self._lead()
            and not self.hang_clock.rechecking()
            and (self.task_look is None or self.task_look.deadline != deadline)
        ):
            self.task_look = TaskLook(deadline, lambda: look_fn(launch))
        due = self.hang_clock.check(now)
        if due is None or due.rechecked or self.task_look is None:
            return due
        look, self.task_look = self.task_look, None
        if look.result(self.opts.watch.hang_evidence_timeout_s) is not False:
            return due  # alive, or not known (a node that does not answer is the hang path's to name)
        self.reporter.decision(
            "step_tasks_ended",
            attempt=launch.attempt,
            silent_s=round(due.silent_s, 1),
            threshold_s=round(due.threshold_s, 1),
            why="no task of the step is left; srun waits on a process that escaped it",
        )
        self.reap(list(launch.nodes), escaped_only=True)
        self.hang_clock.dismiss(time.monotonic())
        return None

    def _note_first_progress(self, launch: AttemptLaunch) -> None:
        """Record the attempt's first step at once (goodput ledger): a job cancelled later may be killed
        before the wrapper writes its `attempt_ended`, and this is what tells how much of the last fault's
        work was redone."""
        if self._progress_noted:
            return
        seen = self.progress.steps_seen()
        first_at = self.progress.first_progress()
        if seen is None or first_at is None:
            return
        self._progress_noted = True
        self.reporter.decision(
            "attempt_progress",
            attempt=launch.attempt,
            first_step=seen[0],
            first_progress_at=round(time.time() - (time.monotonic() - first_at), 3),
        )

    def _watch_stragglers(self, launch: AttemptLaunch, now: float) -> None:
        if self.stragglers is None:
            return
        with self.progress.lock:
            found = self.stragglers.tick(now)
        for s in found:
            if self.on_straggler is not None:
                self.on_straggler(launch, s)

    def _check_running(self, failed_at: float) -> bool:
        try:
            running = bool(named_steps(self.client, self.opts.job_id, self.current_name))
        except HPResilienceError:
            return False
        if running:
            latency = time.monotonic() - failed_at
            self.reporter.observe_restart(latency)
            self.reporter.decision("step_running", step_name=self.current_name, restart_latency_s=round(latency, 3))
        return running

    def _bad_nodes(self, launch: AttemptLaunch) -> list[str]:
        watched = self.watch.bad_nodes(launch.nodes)  # reads the job, not the nodes
        bad = [n for n in watched if node_is_bad(n)]
        drained = [n for n in watched if planned_move(n)]
        if drained and not self.draining:
            self.draining = [n.name for n in drained]
            self.drain_reason = "; ".join(f"{n.name} {n.reason}" for n in drained if n.reason)[:300]
        for n in bad:
            age = time.time() - n.reason_changed_at if n.reason_changed_at else None
            if age is not None and 0 <= age < MAX_DETECTION_AGE_S:
                self.reporter.observe_detection(age)
            self.reporter.decision(
                "node_fault_seen",
                node=n.name,
                state=n.state_text,
                reason=n.reason or None,
                detection_latency_s=round(age, 3) if age is not None else None,
            )
        return [n.name for n in bad]

    # -- stopping ------------------------------------------------------------------------------------
    def forward(self, signum: int) -> None:
        """From a signal handler: pass a notice (USR1/USR2) straight to srun, which hands it to the tasks."""
        step = self.current
        if step is not None and signum not in (signal.SIGINT, signal.SIGTERM):
            step.signal(signum)

    def stop(self, step: StepProcess, sig: int, timeout: float) -> int | None:
        """Shutdown signal to the tasks, wait `timeout`, then cancel the step and kill srun."""
        if self._stopping:
            return step.poll()
        self._stopping = True
        sig_name = signal.Signals(sig).name
        self.reporter.decision("step_stopping", step_name=self.current_name, signal=sig_name, timeout_s=timeout)
        if sig != signal.SIGKILL and timeout > 0:
            self._signal_tasks(step, sig_name.removeprefix("SIG"))
            rc = step.wait(timeout)
            if rc is not None:
                return rc
        # srun answers SIGTERM by killing the step's tasks on every node it can reach, at once.
        step.signal(signal.SIGTERM)
        rc = step.wait(SRUN_TERMINATE_GRACE_S)
        if rc is None:
            self._signal_tasks(step, "KILL")
            step.kill_group()
            rc = step.wait(5.0)
        return rc

    def kill_now(self, step: StepProcess, why: str) -> int | None:
        """Cancel the step by its id at once (scancel kills every task on every node), then make sure srun
        is gone; no grace period, which only a step that can still save or finish deserves."""
        if self._stopping:
            return step.poll()
        self._stopping = True
        started = time.monotonic()
        try:
            found = named_steps(self.client, self.opts.job_id, self.current_name)
        except HPResilienceError:
            found = []
        for s in found:
            signal_step(self.client, s.step_id, timeout=2.0)
        rc = step.wait(SRUN_AFTER_CANCEL_S)
        if rc is None:
            step.kill_group()
            rc = step.wait(2.0)
        self.reporter.decision(
            "step_killed",
            step_name=self.current_name,
            why=why,
            steps=",".join(s.step_id for s in found) or None,
            took_s=round(time.monotonic() - started, 3),
        )
        return rc

    def reap(self, nodes: list[str], escaped_only: bool = False) -> None:
        """Before the next attempt: no task of an earlier one may live on `nodes` (they must be answering).
        With proctrack/cgroup nothing is found; under proctrack/pgid torchrun's workers (own sessions)
        outlive a cancelled step and would go on training, and writing checkpoints, beside the new one.
        `escaped_only`: while the step's srun still runs, only what escaped the step (no slurmstepd above it)."""
        if not nodes:
            return
        started = time.monotonic()
        env = {k: v for k, v in self.env.items() if k != TASK_MARKER}
        reaper = reap_escaped_processes if escaped_only else reap_marked_processes
        try:
            killed, unchecked = reaper(
                self.client, self.opts.job_id, nodes, f"{TASK_MARKER}={self.opts.job_id}", env, REAP_TIMEOUT_S
            )
        except HPResilienceError as err:
            killed, unchecked = [], list(nodes)
            log.warning("stale_task_check_failed", error=str(err)[:300])
        for k in killed:
            self.reporter.decision("stale_task_killed", node=k.node, pid=k.pid, command=k.command)
        self.reporter.decision(
            "old_tasks_checked",
            nodes=",".join(nodes),
            killed=len(killed),
            unchecked=",".join(unchecked) or None,
            took_s=round(time.monotonic() - started, 3),
        )

    def _notice(self, launch: AttemptLaunch, why: str, clear: bool = False) -> None:
        started = time.monotonic()
        env = {k: v for k, v in self.env.items() if k != TASK_MARKER}
        try:
            missed = write_notice(
                self.client, self.opts.job_id, list(launch.nodes), self.notice_file, why, env, clear=clear
            )
        except HPResilienceError as err:
            missed = list(launch.nodes)
            log.warning("step_notice_failed", error=str(err)[:300])
        self.noticed = True
        self.reporter.decision(
            "step_notice_cleared" if clear else "step_notice_sent",
            nodes=",".join(launch.nodes),
            missed=",".join(missed) or None,
            took_s=round(time.monotonic() - started, 3),
        )

    def settle(self, nodes: list[str], bound_s: float = SETTLE_S) -> None:
        """Before launching on nodes that left the job and came back (a fast repair): slurmd there is still ending
        the job's old step, and until its slurmstepd is gone it kills every step of the job it is sent (seen on
        22.05: the relaunched task `Killed` 1.5 s after its start, as the old step's slurmstepd ended). Old tasks
        are killed, then the wait lasts until no earlier step of the job is left there, or bound_s."""
        started = time.monotonic()
        env = {k: v for k, v in self.env.items() if k != TASK_MARKER}
        rounds = 0
        while True:
            rounds += 1
            try:
                busy, unchecked = lingering_steps(self.client, self.opts.job_id, nodes, env)
            except HPResilienceError as err:
                busy, unchecked = set(), list(nodes)
                log.warning("stale_step_check_failed", error=str(err)[:300])
            waited = time.monotonic() - started
            if not busy or waited >= bound_s:
                self.reporter.decision(
                    "returned_nodes_settled",
                    nodes=",".join(nodes),
                    rounds=rounds,
                    busy=",".join(sorted(busy)) or None,
                    unchecked=",".join(unchecked) or None,
                    took_s=round(waited, 3),
                )
                return
            time.sleep(0.2)

    def _signal_tasks(self, step: StepProcess, sig: str) -> None:
        try:
            found = named_steps(self.client, self.opts.job_id, self.current_name)
        except HPResilienceError:
            found = []
        if not found:
            step.signal(getattr(signal, f"SIG{sig}"))
        for s in found:
            signal_step(self.client, s.step_id, sig)

    def _sweep(self, name: str) -> None:
        """Cancel any step of ours still known to Slurm after srun exited (srun killed, or lost).

        A cancelled step stays listed (and holds its CPUs) while its slurmstepds finish, and one with a part on
        a dead node until Slurm gives that node up: the next step is then launched with --overlap at once (or
        it would wait for "Requested nodes are busy"); reap() has confirmed that none of its tasks lives."""
        try:
            left = named_steps(self.client, self.opts.job_id, name)
            for s in left:
                signal_step(self.client, s.step_id)
                self.reporter.decision("leftover_step_cancelled", step=s.step_id, nodes=",".join(s.nodes))
            self.overlap = bool(left)
        except HPResilienceError as err:
            log.warning("step_sweep_failed", error=str(err)[:300])

    def ensure_stopped(self) -> None:
        step = self.current
        if step is not None and step.poll() is None:
            self.stop(step, signal.SIGKILL, 0.0)
            self._sweep(self.current_name)

    # -- pre/post scripts ----------------------------------------------------------------------------
    def _script(self, which: str, script: str, launch: AttemptLaunch, env: dict[str, str]) -> int:
        """Run a script once per node of the attempt (as hyperpodrun does around training)."""
        try:
            res = run_on_nodes(
                self.client,
                self.opts.job_id,
                list(launch.nodes),
                script,
                f"hpr-{which}",
                self.opts.script_timeout_s,
                env,
            )
        except HPResilienceError as err:
            self.reporter.decision(f"{which}_script_failed", script=script, error=str(err)[:300])
            return 1
        for data, sink in ((res.stdout, self.stdout), (res.stderr, self.stderr)):
            if data:
                sink.write(data.encode())
                sink.flush()
        self.reporter.decision(f"{which}_script_done", script=script, exit_code=res.returncode)
        return res.returncode if res.returncode is not None else 1  # None only for a timeout: SlurmTimeout
