"""Warm standbys: the hot spares' ranks started ahead of any fault (in-process mode, issue 33 item 4).

Without them the replacement of a failed node pays, after the new world is written, for a step launch, a Python
start, `import torch` and the model's construction before it can join: most of the in-process mode's fault ->
training again time (bench/bench_inprocess.py). With them, each hot spare runs a per-node step from the job's start
(a spare taken back between faults, decide/spares.py, gets one at once; any other spare that appears later gets
one at the next world written) whose tasks run the user's command as any rank does, with HPR_STANDBY_NODE in
place of HPR_RANK_BASE: they import torch, build the model and wait in the library loop's start for a world that
names their node (hpresilience/torch/standby.py).

On a fault the wrapper gives the failed node's slot to a spare as before (decide/capacity.py); when that spare's
standby step is running, its step becomes the slot's step (NodeSteps.adopt): no step is launched, the world file
written is the assignment. Slurm's cost stays O(1) per fault: the failed node's step cancelled, and at most one
standby launched per spare that has none. A standby is in no world (not counted, in no collective) until named.
It is a step of the job: it ends when the wrapper stops it (job done, fallback to the relaunch path) or with the
job.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from hpresilience.autoresume.launch.pernode import NodeStep, NodeSteps, StepCommand
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.nodewatch import unfit_to_wait
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.torch.world import GENERATION_VAR, RANK_BASE_VAR, STANDBY_NODE_VAR, WORLD_FILE_VAR


def standby_step_env(base: Mapping[str, str], world_file: str, node: str, generation: int) -> dict[str, str]:
    """A standby's environment: no rank (HPR_RANK_BASE is the assignment's), its node, and the generation it
    waits beyond (the world current at its launch, which does not name its node)."""
    env = {k: v for k, v in base.items() if k != RANK_BASE_VAR}
    env.update({WORLD_FILE_VAR: world_file, STANDBY_NODE_VAR: node, GENERATION_VAR: str(generation)})
    return env


class Standbys:
    """The job's running standby steps, by node (apart from the training steps: the poll loop never sees them)."""

    def __init__(
        self, steps: NodeSteps, reporter: Reporter, enabled: bool, command: StepCommand, world_file: str
    ) -> None:
        self.steps = steps
        self.reporter = reporter
        self.enabled = enabled
        self.command = command
        self.world_file = world_file

    @property
    def nodes(self) -> list[str]:
        return sorted(self.steps.running)

    def take(self, node: str) -> NodeStep | None:
        """The standby step running on `node`, out of this set (it becomes a training step), or None."""
        self._reap()
        step = self.steps.running.pop(node, None)
        if step is not None:
            self.reporter.decision(
                "standby_taken", node=node, step=step.name, warm_s=round(time.monotonic() - step.started, 3)
            )
        return step

    def spares(
        self, client: SlurmClient, allocation: Sequence[str], plan: Sequence[str], kept_out: Sequence[str]
    ) -> list[str]:
        """The allocation's nodes outside the step that are fit to wait on: not kept out, not bad in Slurm's eyes
        (one query of those nodes by name, only when there are any without a standby)."""
        candidates = [n for n in allocation if n not in plan and n not in kept_out and n not in self.steps.running]
        if not candidates or not self.enabled:
            return []
        try:
            known = client.known_nodes(candidates)
        except HPResilienceError as err:
            self.reporter.decision("standby_nodes_unread", nodes=",".join(candidates), error=str(err)[:200])
            return []
        fit = {n.name for n in known if not unfit_to_wait(n)}
        return [n for n in candidates if n in fit]

    def start(self, nodes: Sequence[str], base: Mapping[str, str], generation: int) -> None:
        """A standby step on each of `nodes`, beside the world of `generation`; `base`: the steps' environment."""
        for node in nodes if self.enabled else ():
            name = f"hpr-inprocess-{self.command.job_id}-standby-g{generation}-{node}"
            env = standby_step_env(base, self.world_file, node, generation)
            self.steps.start(node, name, self.command.argv(node, name, env), env)
            self.reporter.decision("standby_started", node=node, step=name, after_generation=generation)

    def stop(self, nodes: Sequence[str]) -> None:
        """The standbys of `nodes` (spares leaving the job), stopped."""
        for node in nodes:
            if node in self.steps.running:
                self.steps.stop(node)
                self.reporter.decision("standby_stopped", node=node)

    def stop_all(self) -> None:
        self.steps.stop_all()

    def _reap(self) -> None:
        """Standby steps that ended (their node died, the user's code failed before its loop): said, dropped; a
        spare without one is replaced the cold way."""
        for node, rc in self.steps.ended().items():
            self.reporter.decision("standby_ended", node=node, exit_code=rc)
