"""Hangs in the in-process recovery mode (autoresume/inprocess.py; issue 33): the relaunch path's hang clock and
evidence probe, with a verdict the in-process loop can act on without killing the survivors.

A rank that is stopped (SIGSTOP, a debugger) or stuck in the kernel holds every other rank in the step's
all-reduce: nothing fails and no node is marked, so without this the world would wait for ever. The clock
(watch/hang.py) reads the job's one progress stream, fed by every node's step (the ranks' hpresilience.torch
heartbeats, the step counters in their output); at its deadline the investigator (watch/evidence.py) probes every
node of the world and names the suspects. A verdict that names one node, every other node answering, is a node
fault: the node is marked as the relaunch path marks a hang's culprit (Action:Reboot, decide/ending.py), its step
is cancelled (Slurm kills the stopped process too), and the loop replaces it in the running world; the
survivors, whose all-reduce fails or who see the new world, recover in-process. A verdict that names no node (or
several) is the relaunch path's: the loop falls back to it and says why.

Between a fault and the new world's first step nothing progresses by design (the survivors wait for the
replacement, which starts Python, imports torch, builds its model and receives their state): that silence is
judged as a first step is, against max(hang_floor_s, hang_first_step_s) from the new world's announce, until a
rank of a replaced slot reports a completed step (the new world trains); from then on the clock reads the stream
as the relaunch path's does (it is read again from the announce: the old world's intervals say nothing of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.base import StepView
from hpresilience.autoresume.watch.evidence import HangInvestigator
from hpresilience.autoresume.watch.hang import Attribution, HangClock, HangDue

HEARTBEAT_VAR = "HPR_HEARTBEAT_EVERY_S"


@dataclass(frozen=True)
class Hung:
    """A hang verdict: the node that holds the world up (None: the evidence names no single node), and why."""

    node: str | None
    why: str
    marked: bool = False


class InProcessHangs:
    def __init__(
        self,
        opts: WrapperOptions,
        progress: ProgressStream,
        investigator: HangInvestigator,
        reporter: Reporter,
        mark: Callable[[str, str, str], bool],
    ) -> None:
        w = opts.watch
        self.opts = opts
        self.progress = progress
        self.clock = HangClock(progress, w.hang_floor_s, w.hang_interval_factor, w.hang_first_step_s)
        self.investigator = investigator
        self.reporter = reporter
        self.mark = mark  # decide/ending.Ending.mark_suspect: Action:Reboot with the evidence's path
        self.waiting: set[int] = set()  # ranks of the replaced slots: the clock runs once one has progressed
        self.announced_at = 0.0  # when the world the replacement joins was announced (the stream's clock)
        self.looked_again_for: tuple[int, float | None] | None = None  # the silence a probe found nothing in
        self.generation = 0

    @staticmethod
    def step_env(opts: WrapperOptions) -> dict[str, str]:
        """What every node's step needs for the watch: the heartbeats' rate, as the relaunch path sets it."""
        return {HEARTBEAT_VAR: f"{opts.watch.heartbeat_every_s:g}"}

    def new_world(self, generation: int, plan: Sequence[str], tasks_per_node: int, new_slots: Sequence[int]) -> None:
        """A world was announced: read progress afresh; the replaced slots' ranks (none in the first world) have
        the first step's allowance to complete a step."""
        self.generation = generation
        self.announced_at = self.progress.clock()
        self.progress.reset([n for n in plan for _ in range(tasks_per_node)])
        self.clock.reset()
        self.waiting = {r for slot in new_slots for r in range(slot * tasks_per_node, (slot + 1) * tasks_per_node)}

    def _due(self, now: float) -> HangDue | None:
        """The recovery's silence against the first step's allowance until the new world trains; then the clock."""
        if self.waiting and self.waiting & set(self.progress.ranks()):
            self.waiting = set()
        if not self.waiting:
            return self.clock.check(now)
        limit = max(self.opts.watch.hang_floor_s, self.opts.watch.hang_first_step_s)
        silent = now - self.announced_at
        return HangDue(silent, limit, self.announced_at, None) if silent >= limit else None

    def _ending(self, found: Attribution) -> bool:
        """Nothing stood out, or every rank the stream knows exited on a node that answered: no rank is left to
        hold the others (one rank gone while the rest wait is a culprit, and is not this)."""
        if not found.suspects:
            return True
        gone = {s.rank for s in found.suspects if s.exited}
        every = all(s.exited for s in found.suspects) and gone >= set(self.progress.ranks())
        return every and not found.unanswered

    def poll(self, now: float, view: StepView) -> Hung | None:
        due = self._due(now)
        if due is None:
            return None
        found = self.investigator(view, due)
        why = "; ".join(s.why for s in found.suspects)[:500] or "no rank or node stood out"
        if self._ending(found) and self.looked_again_for != (self.generation, self.progress.last_progress()):
            # Every node answered and every rank runs, or every rank has exited: a world whose ranks are ending
            # (the last step done, the processes exiting on a loaded machine, the steps' ends not yet seen) is as
            # silent as a hang. Once per silence, look again a threshold later before falling back; a world that
            # ends meanwhile ends the loop.
            self.looked_again_for = (self.generation, self.progress.last_progress())
            self.reporter.decision(
                "inprocess_hang_rechecked", generation=view.attempt, silent_s=round(due.silent_s, 1), why=why
            )
            self.clock.dismiss(self.progress.clock())
            self.announced_at = self.progress.clock()
            return None
        if not found.unambiguous:
            self.reporter.decision(
                "inprocess_hang_unattributed",
                generation=view.attempt,
                suspects=",".join(found.nodes) or None,
                why=why,
            )
            return Hung(None, f"a hang (no progress for {due.silent_s:.0f} s) that names no single node: {why}")
        node = found.nodes[0]
        marked = False
        if self.opts.watch.mark_suspect_nodes:
            mine = "; ".join(s.why for s in found.suspects if s.node == node)
            marked = self.mark(node, f"hang: {mine}", str(self.investigator.root))
        self.reporter.decision(
            "inprocess_hang_attributed",
            generation=view.attempt,
            node=node,
            rank=",".join(map(str, found.ranks)) or None,
            marked=marked,
            silent_s=round(due.silent_s, 1),
            took_s=round(time.monotonic() - now, 3),
        )
        return Hung(node, f"hung: {why}", marked)
