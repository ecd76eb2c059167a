"""The grow-back watch: a step running short (min_nodes, after a node was lost with no replacement) moves back
to its full size as soon as enough nodes are back in service (decide/capacity.py finds them), unless the job
says `grow_back: never`. A move is planned, not a fault: the ranks are told, save and exit, and the next attempt
runs on the full plan this verdict carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from hpresilience.autoresume.watch.base import Act, StepView, Verdict
from hpresilience.autoresume.watch.table import WatchContext
from hpresilience.errors import HPResilienceError
from hpresilience.log import get_logger

log = get_logger("hpresilience.autoresume")


class GrowBack:
    name = "growback"

    def __init__(self, back_in_service: Callable[[int, Sequence[str]], list[str] | None], every_s: float) -> None:
        self.back_in_service = back_in_service
        self.every_s = every_s
        self.next_poll = 0.0

    def start(self, step: StepView) -> None:
        self.next_poll = time.monotonic() + self.every_s

    def wait_s(self, now: float) -> float | None:
        return None

    def poll(self, now: float, step: StepView) -> Verdict | None:
        if now < self.next_poll:
            return None
        self.next_poll = now + self.every_s
        if len(step.nodes) >= step.requested:
            return None
        try:
            plan = self.back_in_service(step.requested, step.nodes)
        except HPResilienceError as err:
            log.warning("slurm_poll_failed", error=str(err)[:300])
            return None
        if plan is None:
            return None
        back = [n for n in plan if n not in step.nodes]
        why = f"grow back to {len(plan)} nodes: {','.join(back)} back in service"
        return Verdict(self.name, Act.MOVE, why, target=tuple(plan))


def detector(ctx: WatchContext) -> GrowBack | None:
    if ctx.opts.grow_back == "never":
        return None
    return GrowBack(ctx.back_in_service, ctx.opts.poll_interval_s)
