"""The node watch: the step's nodes as Slurm and the controller see them (nodewatch.py reads them at a cost that
does not grow with the cluster). A node marked bad stops the step at once: on a real cluster its survivors
would hang in a collective until a timeout. A node drained for a planned move (a notice: maintenance, a
scheduled event) moves the step instead: the ranks are told, save and exit, and the step goes on without it.
"""

from __future__ import annotations

import time

from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.base import Act, StepView, Verdict
from hpresilience.autoresume.watch.nodewatch import NodeWatch, node_is_bad
from hpresilience.autoresume.watch.table import WatchContext
from hpresilience.slurm.adminword import planned_move

# A detection latency older than this is a node marked long before the step ran on it: not a latency.
MAX_DETECTION_AGE_S = 3600


class NodeFaults:
    name = "nodes"

    def __init__(self, watch: NodeWatch, reporter: Reporter, poll_interval_s: float) -> None:
        self.watch = watch
        self.reporter = reporter
        self.poll_interval_s = poll_interval_s
        self.next_poll = 0.0
        self.draining: list[str] = []  # drained nodes of the step (planned move), and why
        self.drain_reason = ""

    def start(self, step: StepView) -> None:
        self.next_poll = time.monotonic() + self.poll_interval_s
        self.draining = []
        self.drain_reason = ""

    def wait_s(self, now: float) -> float | None:
        return None

    def poll(self, now: float, step: StepView) -> Verdict | None:
        if now < self.next_poll and not self.watch.nudged():  # a nudge: the controller just wrote a notice
            return None
        self.next_poll = now + self.poll_interval_s
        blamed = self._bad_nodes(step)
        if blamed:
            # The survivors would sit in a collective until it times out: no grace.
            return Verdict(self.name, Act.STOP_NOW, f"node(s) {','.join(blamed)} marked bad", nodes=tuple(blamed))
        if self.draining:
            why = f"node(s) {','.join(self.draining)} drained: {self.drain_reason}"
            return Verdict(self.name, Act.MOVE, why, nodes=tuple(self.draining))
        return None

    def _bad_nodes(self, step: StepView) -> list[str]:
        watched = self.watch.bad_nodes(step.nodes)  # reads the job, not the nodes
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


def detector(ctx: WatchContext) -> NodeFaults:
    return NodeFaults(ctx.nodewatch, ctx.reporter, ctx.opts.poll_interval_s)
