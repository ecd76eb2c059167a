"""The integrity watch: training that runs but is wrong (docs/integrity.md).

Two kinds of report reach it through the progress stream (losses.py has the values and the arithmetic):
- hpresilience.torch's replica check (torch/integrity.py): every N steps the data-parallel replicas compare a
  hash of their parameters and optimizer state; rank 0 reports `replica=ok` or `replica=bad bad_rank=R
  bad_node=N`. A disagreement stops the step at once (every update since the last check that passed may carry
  the bad rank's gradients); the next attempt restores the newest checkpoint at or before that check
  (HPR_RESTORE_MAX_STEP). A node named `replica_mark_after` times is swapped out (a HARDWARE verdict) and its
  verdict asks for it to be marked Action:Replace with the evidence (decide/marking.py does, after the step: a
  detector acts on nothing); before that the step goes again on the same nodes.
- the loss (and grad norm) of each step, from the heartbeat, else from the output lines that print one. A
  non-finite value, or a spike (a robust z-score above loss_spike_z over the source's window), triggers the
  user's loss_policy: `stop` ends the job with a one-line reason on the job's stderr; `rollback` relaunches from
  the newest checkpoint before the step and tells the ranks to skip the steps that produced it (HPR_SKIP_STEPS,
  read by torch/integrity.skip_steps), at most loss_rollbacks times, then stops.

What it learns (the nodes named and how often, the newest step that passed, the restore bound, the steps to skip,
the rollbacks spent) lives in the wrapper's state file (WrapperState.integrity) and is read back by a requeued run.
The restore bound holds until a later attempt passes the highest step the failed one reached (by then the
checkpoints it may have tainted are saved again). A report names only a node of the step it came from: a
line forged in the job's own output can stop its own job, not mark a node it does not run on.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.autoresume.state import WrapperState
from hpresilience.autoresume.watch.base import Act, MarkRequest, StepView, Verdict
from hpresilience.autoresume.watch.losses import LossSample, SpikeWatch, ranges_text
from hpresilience.autoresume.watch.rules import LogState, RuleTripped
from hpresilience.autoresume.watch.table import WatchContext
from hpresilience.reasons import Action

# What the state file keeps (it is read back by every requeued run): bounded, whatever a job does.
MAX_NAMED = 64
MAX_SKIPS = 64
MAX_NAME = 200
MAX_STEP = 10**15
ROLLBACK_RULE = "integrity_rollback"
STOP_RULE = "integrity_stop"


class Integrity:
    name = "integrity"

    def __init__(
        self,
        settings: AutoResumeSettings,
        progress: ProgressStream,
        reporter: Reporter,
        state: WrapperState | None = None,
    ) -> None:
        self.w = settings
        self.progress = progress
        self.reporter = reporter
        self.state = state  # where the memory below outlives a requeue (the wrapper saves it before each attempt)
        self.named: dict[str, int] = {}  # node -> times the replica check named it (the job's life)
        self.last_ok: int | None = None  # the newest step the replica check passed at
        self.restore_max: int | None = None  # HPR_RESTORE_MAX_STEP for the next attempts, until tainted_to passed
        self.tainted_to = -1
        self.skips: list[tuple[int, int]] = []
        self.rollbacks = 0
        self.spikes: dict[str, SpikeWatch] = {}
        self.beat_losses = False
        if state is not None and state.integrity:
            self._restore(state.integrity)

    # -- memory across a requeue (WrapperState.integrity) ----------------------------------------------------------
    def to_record(self) -> dict[str, Any]:
        return {
            "named": dict(sorted(self.named.items(), key=lambda kv: -kv[1])[:MAX_NAMED]),
            "last_ok": self.last_ok,
            "restore_max": self.restore_max,
            "tainted_to": self.tainted_to,
            "skips": [list(r) for r in self.skips[-MAX_SKIPS:]],
            "rollbacks": self.rollbacks,
        }

    def _restore(self, rec: object) -> None:
        """Back from the state file; anything that is not what to_record writes is dropped, field by field (the
        file is the job user's to edit: a bad field costs its memory, never the wrapper)."""
        if not isinstance(rec, dict):
            return
        named = rec.get("named")
        if isinstance(named, dict):
            self.named = {str(n)[:MAX_NAME]: c for n, c in list(named.items())[:MAX_NAMED] if _count(c) is not None}
        self.last_ok, self.restore_max = _count(rec.get("last_ok")), _count(rec.get("restore_max"))
        tainted = _count(rec.get("tainted_to"))
        self.tainted_to = tainted if tainted is not None else -1
        skips = rec.get("skips")
        if isinstance(skips, list):
            pairs = [r for r in skips[-MAX_SKIPS:] if isinstance(r, list) and len(r) == 2]
            self.skips = [
                (a, b)
                for a, b in ((_count(x), _count(y)) for x, y in pairs)
                if a is not None and b is not None and a <= b
            ]
        self.rollbacks = _count(rec.get("rollbacks")) or 0
        self.reporter.decision(
            "integrity_state_restored",
            named=",".join(f"{n}:{c}" for n, c in self.named.items()) or None,
            restore_max_step=self.restore_max,
            skip=ranges_text(self.skips) or None,
            rollbacks=self.rollbacks,
        )

    def _keep(self) -> None:
        if self.state is not None:
            self.state.integrity = self.to_record()

    def start(self, step: StepView) -> None:
        self.spikes, self.beat_losses = {}, False

    def wait_s(self, now: float) -> float | None:
        return None

    def step_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.restore_max is not None:
            env["HPR_RESTORE_MAX_STEP"] = str(self.restore_max)
        if self.skips:
            env["HPR_SKIP_STEPS"] = ranges_text(self.skips)
        return env

    def poll(self, now: float, step: StepView) -> Verdict | None:
        with self.progress.lock:
            items = list(self.progress.checks)
            self.progress.checks.clear()
        seen = self.progress.steps_seen()
        if self.restore_max is not None and seen is not None and seen[1] > self.tainted_to:
            self.reporter.decision("restore_bound_lifted", restore_max_step=self.restore_max, passed=seen[1])
            self.restore_max = None
            self._keep()
        for s in items:
            verdict = self._judge(s, now, step)
            if verdict is not None:
                return verdict
        return None

    def _judge(self, s: LossSample, now: float, step: StepView) -> Verdict | None:
        replica = s.value("replica")
        if replica == "ok":
            self.last_ok = s.step
            self._keep()
        elif replica in ("bad", "undecided"):
            return self._disagreement(s, now, step)
        if self.w.loss_policy == "off":
            return None
        if s.source.startswith("rank"):
            self.beat_losses = True
            values = [("loss", s.number("loss")), ("grad norm", s.number("gnorm"))]
        elif self.beat_losses:
            return None  # heartbeats carry the loss: output lines would count it twice
        else:
            values = [("loss", s.loss)]
        for what, v in values:
            if v is None:
                continue
            if not math.isfinite(v):
                return self._diverged(s, f"{what} is {v}", now)
            if what == "loss":
                watch = self.spikes.setdefault(
                    s.source, SpikeWatch(self.w.loss_spike_window, self.w.loss_spike_z, self.w.loss_spike_min_samples)
                )
                z = watch.add(v)
                if z is not None:
                    return self._diverged(
                        s, f"loss spike {v:g} (robust z-score {z:.1f} > {self.w.loss_spike_z:g})", now
                    )
        return None

    def _highest_step(self, s: LossSample) -> int:
        seen = self.progress.steps_seen()
        return max(s.step, seen[1] if seen is not None else -1)

    def _disagreement(self, s: LossSample, now: float, step: StepView) -> Verdict | None:
        node, rank = s.value("bad_node") or "", s.value("bad_rank") or "?"
        if node not in step.nodes:
            self.reporter.decision("replica_report_ignored", node=node or None, rank=rank, why="not a node of the step")
            return None
        # Two replicas that differ (no majority) tell that one is wrong, not which: roll back, name no node.
        decided = s.value("replica") == "bad"
        count = self.named[node] = self.named.get(node, 0) + decided
        self.restore_max = self.last_ok if self.last_ok is not None and self.last_ok < s.step else 0
        self.tainted_to = self._highest_step(s)
        why = (
            f"replica disagreement at step {s.step}: rank {rank} on {node} differs from its replicas "
            f"(named {count} of {self.w.replica_mark_after} times; last check passed at step {self.last_ok})"
        )
        self.reporter.decision(
            "replica_disagreement",
            rank=rank,
            node=node,
            step=s.step,
            named=count,
            mark_after=self.w.replica_mark_after,
            last_ok_step=self.last_ok,
            restore_max_step=self.restore_max,
        )
        self._keep()
        trip = RuleTripped(ROLLBACK_RULE, LogState.FAULTED, why, now)
        if decided and count >= self.w.replica_mark_after:
            # The node leaves the step; decide/marking.py marks it, with the replica_disagreement events as evidence.
            evidence = str(self.reporter.store.events_path)
            mark = MarkRequest(Action.REPLACE, why, evidence, "sdc_node_marked")
            return Verdict(self.name, Act.STOP_NOW, why, nodes=(node,), trip=trip, mark=mark)
        return Verdict(self.name, Act.STOP_NOW, why, trip=trip)

    def _diverged(self, s: LossSample, what: str, now: float) -> Verdict:
        at = s.step if s.step >= 0 else self._highest_step(s)
        why = f"{what} at step {at} ({s.source} on {s.node or 'an unknown node'})"
        if self.w.loss_policy == "rollback" and self.rollbacks < self.w.loss_rollbacks:
            self.rollbacks += 1
            first = max(0, at - self.w.loss_skip_steps + 1)
            self.skips.append((first, at))
            self.restore_max = min(at - 1, self.restore_max if self.restore_max is not None else at - 1)
            self.tainted_to = self._highest_step(s)
            self.reporter.decision(
                "integrity_rollback",
                why=why,
                restore_max_step=self.restore_max,
                skip=f"{first}-{at}",
                rollbacks=self.rollbacks,
                budget=self.w.loss_rollbacks,
            )
            self._keep()
            return Verdict(self.name, Act.STOP_NOW, why, trip=RuleTripped(ROLLBACK_RULE, LogState.FAULTED, why, now))
        spent = self.w.loss_policy == "rollback"
        line = f"training stopped: {why}" + (f"; {self.rollbacks} rollbacks spent" if spent else "; loss_policy stop")
        self.reporter.decision("integrity_stop", why=line, policy=self.w.loss_policy, rollbacks=self.rollbacks)
        try:
            sys.stderr.write(f"[hpresilience] {line}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # the job's output is gone; the events hold the same
        return Verdict(self.name, Act.STOP_NOW, line, trip=RuleTripped(STOP_RULE, LogState.FAULTED, line, now))


def _count(v: object) -> int | None:
    """A step or a count as the state file holds it: a whole number from 0 to MAX_STEP, else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STEP else None


def detector(ctx: WatchContext) -> Integrity:
    return Integrity(ctx.opts.watch, ctx.progress, ctx.reporter, ctx.state)
