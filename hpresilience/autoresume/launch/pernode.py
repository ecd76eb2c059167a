"""One srun step per node, for the in-process recovery mode (autoresume/inprocess.py).

A step that spans several nodes is one unit to Slurm: when one of its nodes is lost, srun ends the step on all of
them (docs/slurm-notes.md, "Losing one node of a step"), and the wrapper's own STOP_NOW cancels the step whole.
With a step per node, cancelling the failed node's step leaves the others running, which is what lets the
survivors keep their processes and their memory. Each step runs `tasks_per_node` tasks on its node; a task's
global rank is HPR_RANK_BASE + SLURM_LOCALID (hpresilience/torch/world.py), the node's slot times
tasks_per_node, so a replacement taking a slot takes that slot's ranks.

Slurm cost stays O(1) per fault: one step is cancelled and one launched, whatever the job's size (the launch of
N steps at the start costs N step creations instead of one).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from hpresilience.autoresume.launch.plan import carried_names, export_option
from hpresilience.autoresume.launch.stream import Pump
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.watch.feed import RuleFeed
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.srun import StepProcess
from hpresilience.slurm.steps import named_steps, signal_step
from hpresilience.torch.world import GENERATION_VAR, RANK_BASE_VAR, WORLD_FILE_VAR

# After its step is cancelled srun waits for every node's report: it is killed after this.
SRUN_AFTER_CANCEL_S = 0.5


@dataclass(frozen=True)
class StepCommand:
    """The job's own srun command as one node's step: the training steps and the standby steps alike."""

    srun: str
    job_id: int
    tasks_per_node: int
    passthrough: tuple[str, ...]
    command: tuple[str, ...]
    user_export: str | None = None

    def argv(self, node: str, step_name: str, env: Mapping[str, str]) -> list[str]:
        """One node's step: all its tasks on that node. `--kill-on-bad-exit=0`: a task that dies must not take its
        node's other tasks with it before the library has seen the failure (it reports, the wrapper decides).
        `user_export`: the user's own --export, kept, with what the step is placed by (in `env`) added to a list."""
        return [
            self.srun,
            f"--jobid={self.job_id}",
            "--nodes=1",
            f"--ntasks={self.tasks_per_node}",
            f"--nodelist={node}",
            "--kill-on-bad-exit=0",
            f"--export={export_option(self.user_export, carried_names(env))}",
            *self.passthrough,
            f"--job-name={step_name}",  # last but the command: wins over a user's -J, the wrapper finds it by it
            *self.command,
        ]


def node_step_env(
    base: Mapping[str, str], world_file: str, slot: int, tasks_per_node: int, generation: int
) -> dict[str, str]:
    env = dict(base)
    env.update(
        {
            WORLD_FILE_VAR: world_file,
            RANK_BASE_VAR: str(slot * tasks_per_node),
            GENERATION_VAR: str(generation),
        }
    )
    return env


@dataclass
class NodeStep:
    node: str
    name: str
    process: StepProcess
    pumps: list[Pump] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


class NodeSteps:
    """The running per-node steps of the job, by node."""

    def __init__(
        self,
        client: SlurmClient,
        job_id: int,
        feed: RuleFeed,
        stdout: IO[bytes],
        stderr: IO[bytes],
        max_line_bytes: int,
        progress: ProgressStream | None = None,
    ) -> None:
        self.client = client
        self.progress = progress  # the job's one progress stream (heartbeats, step counters): the hang watch's
        self.job_id = job_id
        self.feed = feed
        self.stdout = stdout
        self.stderr = stderr
        self.max_line_bytes = max_line_bytes
        self.running: dict[str, NodeStep] = {}

    def start(self, node: str, name: str, argv: Sequence[str], env: Mapping[str, str]) -> NodeStep:
        process = StepProcess(argv, env)
        step = NodeStep(node, name, process)
        for source, sink, what in ((process.stdout, self.stdout, "stdout"), (process.stderr, self.stderr, "stderr")):
            pump = Pump(source, sink, self.feed, self.max_line_bytes, f"{what}-{node}", self.progress)
            pump.start()
            step.pumps.append(pump)
        self.running[node] = step
        return step

    def adopt(self, step: NodeStep) -> None:
        """A step started elsewhere (a warm standby's, launch/standby.py) joins this set as its node's step."""
        self.running[step.node] = step

    def ended(self) -> dict[str, int]:
        """The steps that ended since the last look, by node, with srun's exit status; they leave the set."""
        done = {node: rc for node, s in self.running.items() if (rc := s.process.poll()) is not None}
        for node in done:
            self._forget(node)
        return done

    def stop(self, node: str) -> tuple[int | None, list[str]]:
        """Cancel one node's step by name (only its tasks die), make sure its srun is gone; srun's status and the
        step ids cancelled."""
        step = self.running.get(node)
        if step is None:
            return None, []
        try:
            found = named_steps(self.client, self.job_id, step.name)
        except HPResilienceError:
            found = []
        for s in found:
            signal_step(self.client, s.step_id, timeout=2.0)
        rc = step.process.wait(SRUN_AFTER_CANCEL_S)
        if rc is None:
            step.process.kill_group()
            rc = step.process.wait(2.0)
        self._forget(node)
        return rc, [s.step_id for s in found]

    def stop_all(self) -> None:
        for node in list(self.running):
            self.stop(node)

    def _forget(self, node: str) -> None:
        step = self.running.pop(node)
        for pump in step.pumps:
            pump.join(timeout=5.0)
