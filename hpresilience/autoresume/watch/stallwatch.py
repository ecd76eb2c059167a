"""The stall watch: the whole step went silent at once, so every node of it is asked whether it still answers.

Synchronous training (data parallel, one all-reduce per step) is silent everywhere when one node is cut off:
every rank blocks in the next collective, so "one node silent while the others print" (silence.py) never happens,
and with only rank 0 printing there is a single node's output to watch anyway. Slurm calls the cut node DOWN only
after SlurmdTimeout, and the hang watch waits for its floor (60 s). A silence of a few of the step's own intervals
(`silent_step_s`, at least FACTOR x the median interval between progress events) is cheap to check instead: one
trivial task per node through Slurm, all at once, each bounded by PROBE_S (`slurm/steps.nodes_answering`), in a
thread of its own so the loop never waits on it. A node that runs no task is a node fault, as for the silence
watch: the step is stopped at once and the node kept out of it (and released from the job, decide/capacity.py).

Nodes that all answer say the silence is the training's own (an evaluation, a checkpoint, a slow step): the
hang watch decides about it, and this one looks again only after twice as long a silence (a pause costs a probe
per doubling, not one per poll). When no node answers the probe says more about Slurm than about the nodes
(slurmctld unreachable, the batch host itself cut off): nobody is blamed for it.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.base import Act, Probe, StepView, Verdict
from hpresilience.autoresume.watch.table import WatchContext
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.steps import nodes_answering

# Each node must run a trivial task within this long (as the silence watch's probe).
PROBE_S = 3.0
# A silence counts from this many of the step's own median intervals (a slow step is never a stalled one).
FACTOR = 3.0
# Nodes that answered: the next look at the same silence waits twice as long, up to this.
MAX_S = 300.0


class StallWatch:
    """When to probe the step's nodes: the pure part of the watch (a clock and the stream's two numbers in)."""

    def __init__(self, silent_s: float) -> None:
        self.base_s = silent_s  # 0: off
        self._looked: tuple[float, float] | None = None  # (last progress, next threshold) after nodes answered

    def reset(self) -> None:
        self._looked = None

    def threshold(self, last_progress: float, median_interval: float) -> float:
        base = max(self.base_s, FACTOR * median_interval)
        if self._looked is not None and self._looked[0] == last_progress:
            return max(base, self._looked[1])
        return base

    def due(self, now: float, last_progress: float | None, median_interval: float | None) -> float | None:
        """The threshold the step's silence reached now, if the nodes are to be probed; None otherwise. Before the
        step showed progress twice (no interval yet) it is starting, not stalled: the hang watch's first-step
        deadline covers that."""
        if self.base_s <= 0 or last_progress is None or median_interval is None:
            return None
        threshold = self.threshold(last_progress, median_interval)
        return threshold if now - last_progress >= threshold else None

    def answered(self, last_progress: float, silent_s: float) -> None:
        """The nodes answered (or the probe said nothing) at a silence of `silent_s`: look again at twice that."""
        self._looked = (last_progress, min(MAX_S, 2 * silent_s))


class StalledStep:
    name = "stall"

    def __init__(
        self,
        silent_s: float,
        progress: ProgressStream,
        reporter: Reporter,
        client: SlurmClient,
        job_id: int,
        env: Mapping[str, str],
    ) -> None:
        self.watch = StallWatch(silent_s)
        self.progress = progress
        self.reporter = reporter
        self.client = client
        self.job_id = job_id
        self.env = dict(env)
        self.probe: Probe[dict[str, bool]] | None = None
        self.asked: tuple[float, float, float] = (0.0, 0.0, 0.0)  # last progress, silence, threshold when asked

    def start(self, step: StepView) -> None:
        self.watch.reset()
        self.probe = None

    def wait_s(self, now: float) -> float | None:
        return None

    def poll(self, now: float, step: StepView) -> Verdict | None:
        if self.probe is not None:
            return self._answered(step) if self.probe.done() else None
        last = self.progress.last_progress()
        threshold = self.watch.due(now, last, self.progress.median_interval())
        if threshold is None or last is None or not step.nodes:
            return None
        self.asked = (last, now - last, threshold)
        nodes = list(step.nodes)
        self.probe = Probe(nodes, lambda: self._ask(nodes), "silent_step_probe_failed")
        return None

    def _ask(self, nodes: list[str]) -> dict[str, bool]:
        return nodes_answering(self.client, self.job_id, nodes, self.env, PROBE_S)

    def _answered(self, step: StepView) -> Verdict | None:
        assert self.probe is not None
        answers, took, nodes = self.probe.value, self.probe.took_s, list(step.nodes)
        self.probe = None
        last, silent, threshold = self.asked
        dead = [] if answers is None else [n for n in nodes if not answers.get(n, False)]
        # Nobody answering is Slurm or this host cut off, not every node at once: the hang watch's to judge.
        blamed = dead if len(dead) < len(nodes) else []
        self.reporter.decision(
            "silent_step_probed",
            attempt=step.attempt,
            nodes=",".join(nodes),
            unanswering=",".join(dead) or None,
            silent_since=round(last, 3),  # the last progress: the probes of one silence share it
            silent_s=round(silent, 1),
            threshold_s=round(threshold, 1),
            took_s=round(took, 3),
            blamed=",".join(blamed) or None,
        )
        if not blamed:
            self.watch.answered(last, silent + took)
            return None
        why = f"the whole step silent for {silent:.1f} s and node(s) {','.join(blamed)} not answering"
        return Verdict(self.name, Act.STOP_NOW, why, nodes=tuple(blamed), unanswering=True)


def detector(ctx: WatchContext) -> StalledStep | None:
    if ctx.opts.watch.silent_step_s <= 0:
        return None
    return StalledStep(ctx.opts.watch.silent_step_s, ctx.progress, ctx.reporter, ctx.client, ctx.opts.job_id, ctx.env)
