"""The silence watch: a node whose tasks went quiet while the others print on is probed (silence.py), and one
that runs no task in time is a lost node: the step is stopped at once and the node kept out of it.

The probe (one trivial task through Slurm, up to SILENT_PROBE_S) runs in a thread: the other watches go on
meanwhile, and the verdict comes at the first poll after the answer. Our own task labels name a line's node,
so the watch is off when the user labels the output themselves (or sets silent_node_s to 0).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from hpresilience.autoresume.progress import ProgressStream, RankInfo
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.base import Act, Probe, StepView, Verdict
from hpresilience.autoresume.watch.silence import SilenceWatch
from hpresilience.autoresume.watch.table import WatchContext
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.steps import nodes_answering

# A silent node must run a trivial task within this long (as the liveness probe after a step died of a signal).
SILENT_PROBE_S = 3.0
CHECK_EVERY_S = 1.0


class SilentNodes:
    name = "silence"

    def __init__(
        self,
        silent_s: float,
        progress: ProgressStream,
        reporter: Reporter,
        client: SlurmClient,
        job_id: int,
        env: Mapping[str, str],
    ) -> None:
        self.watch = SilenceWatch(silent_s)
        self.progress = progress
        self.reporter = reporter
        self.client = client
        self.job_id = job_id
        self.env = dict(env)
        self.next_check = 0.0
        # The probe in flight: the suspects, the tasks as they were and the time they were looked at.
        self.probe: Probe[dict[str, bool]] | None = None
        self.asked: tuple[list[str], list[RankInfo], float] = ([], [], 0.0)

    def start(self, step: StepView) -> None:
        self.watch.reset()
        self.probe = None
        self.next_check = time.monotonic() + CHECK_EVERY_S

    def wait_s(self, now: float) -> float | None:
        return None

    def poll(self, now: float, step: StepView) -> Verdict | None:
        if self.probe is not None:
            return self._answered() if self.probe.done() else None
        if now < self.next_check:
            return None
        self.next_check = now + CHECK_EVERY_S
        tasks = list(self.progress.tasks().values())  # each takes the stream's lock itself
        suspects = self.watch.suspects(tasks, step.nodes, now, self.progress.median_interval())
        if suspects:
            self.asked = (suspects, tasks, now)
            self.probe = Probe(suspects, lambda: self._ask(suspects), "silent_node_probe_failed")
        return None

    def _ask(self, suspects: Sequence[str]) -> dict[str, bool]:
        return nodes_answering(self.client, self.job_id, list(suspects), self.env, SILENT_PROBE_S)

    def _answered(self) -> Verdict | None:
        assert self.probe is not None
        answers, took = self.probe.value, self.probe.took_s
        self.probe = None
        suspects, tasks, asked_at = self.asked
        # A probe that failed to run says nothing about the nodes: none is blamed for it.
        dead = [] if answers is None else [n for n in suspects if not answers.get(n, False)]
        self.watch.answered([n for n in suspects if n not in dead], tasks, asked_at)
        self.reporter.decision(
            "silent_nodes_probed",
            nodes=",".join(suspects),
            unanswering=",".join(dead) or None,
            silent_s=round(self.watch.silent_s, 1),
            took_s=round(took, 3),
        )
        if not dead:
            return None
        why = f"node(s) {','.join(dead)} silent and not answering"
        return Verdict(self.name, Act.STOP_NOW, why, nodes=tuple(dead), unanswering=True)


def detector(ctx: WatchContext) -> SilentNodes | None:
    if not ctx.labels_ours or ctx.opts.watch.silent_node_s <= 0:
        return None
    return SilentNodes(ctx.opts.watch.silent_node_s, ctx.progress, ctx.reporter, ctx.client, ctx.opts.job_id, ctx.env)
