"""What the wrapper does on the step's nodes around an attempt, each bounded and reported: kill what an earlier
attempt left (reap), wait for a returning node to finish the job's old step (settle), tell the ranks of a
planned move (the notice file), cancel a step of ours that outlived its srun (sweep), and run the pre/post
training scripts. Whatever happens, no step of ours outlives an attempt: after srun exits the wrapper looks for
a step with its name and cancels it, and before the next attempt `reap` kills any process of an earlier attempt
still alive on the nodes (one that left the step's process tracking, e.g. under proctrack/pgid), each reported
as `stale_task_killed`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from typing import IO

from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.flightrec import DUMP_PREFIX
from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.nodeprocs import lingering_steps, reap_escaped_processes, reap_marked_processes
from hpresilience.slurm.nodescripts import StaleTask
from hpresilience.slurm.srun import StepProcess
from hpresilience.slurm.steps import named_steps, run_on_nodes, signal_step, write_move_notice

log = get_logger("hpresilience.autoresume")
REAP_TIMEOUT_S = 15.0
REAP_TRIES = 3
REAP_RETRY_PAUSE_S = 0.5
# Longest wait for a node back in the job to finish ending the job's old step there (settle()).
SETTLE_S = 10.0
# Every task of an attempt carries this in its environment (value: the job id): `reap` finds them by it.
TASK_MARKER = "HPR_AUTORESUME_JOB"


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


class StepOps:
    def __init__(
        self, client: SlurmClient, job_id: int, env: Mapping[str, str], reporter: Reporter, script_timeout_s: float
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.reporter = reporter
        self.script_timeout_s = script_timeout_s
        # The probes run without our marker: `reap` must never find (and kill) its own probe.
        self.env = {k: v for k, v in env.items() if k != TASK_MARKER}

    def reap(self, nodes: list[str], escaped_only: bool = False) -> None:
        """Before the next attempt: no task of an earlier one may live on `nodes` (they must be answering).
        With proctrack/cgroup nothing is found; under proctrack/pgid torchrun's workers (own sessions)
        outlive a cancelled step and would go on training, and writing checkpoints, beside the new one.
        `escaped_only`: while the step's srun still runs, only what escaped the step (no slurmstepd above it)."""
        if not nodes:
            return
        started = time.monotonic()
        reaper = reap_escaped_processes if escaped_only else reap_marked_processes
        killed: list[StaleTask] = []
        unchecked = list(nodes)
        # A node that did not report back is asked again while the bound lasts: under a loaded slurmctld one
        # srun --overlap can fail at once (step creation refused while the job's step ends) and the orphan it
        # should have killed would train on beside the next attempt.
        for tries in range(1, REAP_TRIES + 1):
            left = REAP_TIMEOUT_S - (time.monotonic() - started)
            if left < 1.0:
                break
            try:
                found, unchecked = reaper(
                    self.client, self.job_id, unchecked, f"{TASK_MARKER}={self.job_id}", self.env, left
                )
            except HPResilienceError as err:
                found = []
                log.warning("stale_task_check_failed", error=str(err)[:300], tries=tries)
            killed.extend(found)
            if not unchecked or tries == REAP_TRIES:
                break
            time.sleep(min(REAP_RETRY_PAUSE_S, max(0.0, REAP_TIMEOUT_S - (time.monotonic() - started))))
        for k in killed:
            self.reporter.decision("stale_task_killed", node=k.node, pid=k.pid, command=k.command)
        self.reporter.decision(
            "old_tasks_checked",
            nodes=",".join(nodes),
            killed=len(killed),
            unchecked=",".join(unchecked) or None,
            took_s=round(time.monotonic() - started, 3),
        )

    def reap_escaped(self, nodes: list[str]) -> None:
        self.reap(nodes, escaped_only=True)

    def notice(self, nodes: list[str], path: str, why: str, clear: bool = False) -> None:
        """Write (or clear) the notice of a planned move on every node of the step: check_alive() turns False."""
        started = time.monotonic()
        try:
            missed = write_move_notice(self.client, self.job_id, nodes, path, why, self.env, clear=clear)
        except HPResilienceError as err:
            missed = list(nodes)
            log.warning("step_notice_failed", error=str(err)[:300])
        self.reporter.decision(
            "step_notice_cleared" if clear else "step_notice_sent",
            nodes=",".join(nodes),
            missed=",".join(missed) or None,
            took_s=round(time.monotonic() - started, 3),
        )

    def settle(self, nodes: list[str], bound_s: float = SETTLE_S) -> None:
        """Before launching on nodes that left the job and came back (a fast repair): slurmd there is still ending
        the job's old step, and until its slurmstepd is gone it kills every step of the job it is sent (seen on
        22.05: the relaunched task `Killed` 1.5 s after its start, as the old step's slurmstepd ended). Old tasks
        are killed, then the wait lasts until no earlier step of the job is left there, or bound_s."""
        started = time.monotonic()
        rounds = 0
        while True:
            rounds += 1
            try:
                busy, unchecked = lingering_steps(self.client, self.job_id, nodes, self.env)
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

    def signal_tasks(self, step: StepProcess, name: str, sig: str) -> None:
        """The signal to the step's tasks by its id (srun keeps running and reports their exit); to srun when
        the step is not known (yet)."""
        try:
            found = named_steps(self.client, self.job_id, name)
        except HPResilienceError:
            found = []
        if not found:
            step.signal(getattr(signal, f"SIG{sig}"))
        for s in found:
            signal_step(self.client, s.step_id, sig)

    def sweep(self, name: str) -> bool | None:
        """Cancel any step of ours still known to Slurm after srun exited (srun killed, or lost); whether one was
        left (None: not known).

        A cancelled step stays listed (and holds its CPUs) while its slurmstepds finish, and one with a part on
        a dead node until Slurm gives that node up: the next step is then launched with --overlap at once (or
        it would wait for "Requested nodes are busy"); reap() has confirmed that none of its tasks lives."""
        try:
            left = named_steps(self.client, self.job_id, name)
            for s in left:
                signal_step(self.client, s.step_id)
                self.reporter.decision("leftover_step_cancelled", step=s.step_id, nodes=",".join(s.nodes))
            return bool(left)
        except HPResilienceError as err:
            log.warning("step_sweep_failed", error=str(err)[:300])
            return None

    def script(
        self, which: str, script: str, nodes: list[str], env: dict[str, str], stdout: IO[bytes], stderr: IO[bytes]
    ) -> int:
        """Run a script once per node of the attempt (as hyperpodrun does around training)."""
        try:
            res = run_on_nodes(self.client, self.job_id, nodes, script, f"hpr-{which}", self.script_timeout_s, env)
        except HPResilienceError as err:
            self.reporter.decision(f"{which}_script_failed", script=script, error=str(err)[:300])
            return 1
        for data, sink in ((res.stdout, stdout), (res.stderr, stderr)):
            if data:
                sink.write(data.encode())
                sink.flush()
        self.reporter.decision(f"{which}_script_done", script=script, exit_code=res.returncode)
        return res.returncode if res.returncode is not None else 1  # None only for a timeout: SlurmTimeout
