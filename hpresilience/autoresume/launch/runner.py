"""Running one attempt's step: launch it, stream its output, poll the detectors, and stop it as their verdict asks.

The runner decides nothing about the job: each watch is a detector (watch/) that returns a verdict value, and the
runner carries out the first one that acts on the step. Stopping with grace is two-stage, as in hyperpodrun: the
shutdown signal goes to the step's tasks (`scancel --signal`, so srun itself keeps running and reports their
exit), then after the shutdown timeout the step is cancelled and srun is killed. Stopping now (a lost node, a
hang) skips the grace: the step is lost to its collective anyway, so it is cancelled by id at once (`kill_now`).
A move tells the ranks (the notice file: check_alive() turns False) and stops the step only if it is still
running after move_grace_s. What the verdict means for the job is decided after the step (decide/).
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Mapping, Sequence
from typing import IO

from hpresilience.autoresume.launch.plan import AttemptLaunch
from hpresilience.autoresume.launch.stepops import StepOps, flight_recorder_env, user_labels
from hpresilience.autoresume.launch.stream import Pump
from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.base import Act, AttemptResult, Detector, StepEnvSource, StopRequest, Verdict
from hpresilience.autoresume.watch.feed import RuleFeed
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.srun import StepProcess
from hpresilience.slurm.steps import named_steps, signal_step

STEP_POLL_S = 0.1
# srun needs a moment after SIGTERM to tell slurmstepd to kill the tasks and to collect their exit.
SRUN_TERMINATE_GRACE_S = 10.0
# After its step is cancelled srun has nothing left to do but it waits for every node's report (up to
# KillWait + 2 s): it is killed after this.
SRUN_AFTER_CANCEL_S = 0.05


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
        ops: StepOps,
        detectors: Sequence[Detector] = (),
        stop_request: StopRequest | None = None,
        progress: ProgressStream | None = None,
    ) -> None:
        self.opts = opts
        self.client = client
        self.feed = feed
        self.reporter = reporter
        self.env = dict(env)
        self.stdout = stdout
        self.stderr = stderr
        self.ops = ops
        self.detectors = list(detectors)
        self.stop_request = stop_request or StopRequest()
        self.progress = progress or ProgressStream()
        # Our own labels name each line's task; they are taken off again before the user sees the output.
        self.add_labels = opts.watch.label_tasks and not user_labels(opts.srun.passthrough)
        self.notice_file = ""  # this attempt's notice file (run_attempt), and whether it was written
        self.noticed = False
        self.current: StepProcess | None = None
        self.current_name = ""
        self._stopping = False
        self._progress_noted = False
        self.overlap = False  # a dead step of ours still holds resources: share them

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
        for d in self.detectors:
            if isinstance(d, StepEnvSource):
                env.update(d.step_env())
        if self.opts.pre_train_script:
            rc = self.ops.script(
                "pre_train", self.opts.pre_train_script, list(launch.nodes), env, self.stdout, self.stderr
            )
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
            env=env,
        )
        self.feed.reset()
        self.progress.reset([node for node in launch.nodes for _ in range(launch.tasks_per_node)])
        for d in self.detectors:  # after the stream's reset: a detector may read the attempt's start from it
            d.start(launch)
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
        result = self.watch(step, launch, failed_at)
        for p in pumps:
            p.join(timeout=10.0)
        self.current = None
        if (left := self.ops.sweep(name)) is not None:
            self.overlap = left
        if self.noticed:  # the notice directory goes with the attempt
            self.ops.notice(list(launch.nodes), self.notice_file, "", clear=True)
        if self.opts.post_train_script:
            self.ops.script(
                "post_train", self.opts.post_train_script, list(launch.nodes), env, self.stdout, self.stderr
            )
        return result

    def watch(self, step: StepProcess, launch: AttemptLaunch, failed_at: float | None) -> AttemptResult:
        """Poll the detectors in the table's order until the step ends; carry out the first verdict that acts."""
        verdicts: list[Verdict] = []
        decided: Verdict | None = None
        decided_at: float | None = None
        move_deadline: float | None = None
        seen_running = failed_at is None
        while (rc := step.wait(STEP_POLL_S if decided_at is not None else self._until_next_look())) is None:
            now = time.monotonic()
            if self.stop_request:
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
            self._note_first_progress(launch)
            if not seen_running and failed_at is not None:
                seen_running = self._check_running(failed_at)
            for d in self.detectors:
                verdict = d.poll(now, launch)
                if verdict is None:
                    continue
                verdicts.append(verdict)
                if verdict.act is Act.REAP:
                    self.ops.reap_escaped(list(verdict.nodes))
                elif verdict.act is not Act.NOTHING:
                    decided, decided_at = verdict, now
                    move_deadline = self._act(step, launch, verdict, now)
                    break
        if not seen_running and failed_at is not None and decided_at is None:
            self._check_running(failed_at)
        return AttemptResult(rc, decided_at or time.monotonic(), decided, verdicts)

    def _act(self, step: StepProcess, launch: AttemptLaunch, verdict: Verdict, now: float) -> float | None:
        """Carry out a verdict on the running step; a move's deadline (monotonic), if it is one."""
        if verdict.act is Act.STOP_NOW:
            self.kill_now(step, verdict.why)
        elif verdict.act is Act.STOP_GRACE:
            self.stop(step, self.opts.shutdown_signal, self.opts.shutdown_timeout_s)
        elif verdict.act is Act.MOVE:
            self.reporter.decision("step_move_decided", why=verdict.why, attempt=launch.attempt)
            # The ranks save and exit at their next step (check_alive() turns False); the rest is bounded.
            self.noticed = True
            self.ops.notice(list(launch.nodes), self.notice_file, verdict.why)
            return now + self.opts.watch.move_grace_s
        return None

    def _until_next_look(self) -> float:
        """The loop's wait: a poll tick, but never past what a detector asks for (a hang's deadline)."""
        now = time.monotonic()
        wishes = [w for d in self.detectors if (w := d.wait_s(now)) is not None]
        return min(STEP_POLL_S, max(0.0, min(wishes, default=STEP_POLL_S)))

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
            self.ops.signal_tasks(step, self.current_name, sig_name.removeprefix("SIG"))
            rc = step.wait(timeout)
            if rc is not None:
                return rc
        # srun answers SIGTERM by killing the step's tasks on every node it can reach, at once.
        step.signal(signal.SIGTERM)
        rc = step.wait(SRUN_TERMINATE_GRACE_S)
        if rc is None:
            self.ops.signal_tasks(step, self.current_name, "KILL")
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

    def ensure_stopped(self) -> None:
        step = self.current
        if step is not None and step.poll() is None:
            self.stop(step, signal.SIGKILL, 0.0)
            if (left := self.ops.sweep(self.current_name)) is not None:
                self.overlap = left
