"""The controller's repair steps as values: each step the loop drives is one function that reads the record, the
node (its reason parsed once per cycle, selection.Look) and what its worker returned, and returns what to do.

A step writes nothing itself: no Slurm call, no record saved, no log line. `Controller.apply` (loop.py) is the one
place that carries a value out, always in the same order, so that a write Slurm refuses leaves the record as it
was and the step runs again next cycle:

| value    | what the loop does                                                                              |
|----------|--------------------------------------------------------------------------------------------------|
| `Move`   | count a failed attempt, write the marks (scontrol), update the record, move it, save it, count an |
|          | outcome, log the decision, start the worker                                                      |
| `Finish` | resume the node if asked, finish the record (history.jsonl), log the decision                    |
| `Note`   | a dry run's "would ...": the record's `why` and a decision line, nothing written                 |
| `Start`  | start the worker without a move (a gate again after a restart mid-gate)                          |
| `Gated`  | record the gate's result (metric, event), then carry out the value it wraps                      |
| `None`   | nothing this cycle                                                                               |

A step may change the fields of the record that the original order set before any write (the action of the
attempt, the rung, the last health result); what must not be remembered for a refused write is in `Move.update`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from hpresilience.controller.gates import Gate, GateResult
from hpresilience.controller.providers import Provider
from hpresilience.controller.selection import Look
from hpresilience.controller.settings import ControllerSettings
from hpresilience.controller.state import FOR_A_PERSON, RepairRecord, Step
from hpresilience.log import Level
from hpresilience.reasons import controller_reason, person_reason
from hpresilience.slurm.models import Node


@dataclass(frozen=True)
class Move:
    """Move the record to `step` (possibly the one it is at, with a new `why`) and log `event`."""

    step: Step
    why: str
    event: str
    level: Level = "info"
    # (scontrol state, reason) written first, in order; `state` is scontrol's word (drain, down).
    marks: tuple[tuple[str, str], ...] = ()
    # Applied once the marks are written: what must not be remembered if Slurm refused one.
    update: Callable[[RepairRecord], None] | None = None
    # Started in a worker once the record is saved: the provider's act or the health gate.
    start: Callable[[], object] | None = None
    failed: str | None = None  # an attempt failed this way (hpr_controller_repair_failures_total)
    outcome: str | None = None  # the repair ends here for a person (lemon, given_up): counted as an outcome
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finish:
    """The record is done: `outcome` is its word in history.jsonl; `resume`: the node is resumed first."""

    outcome: str
    why: str
    resume: bool = False


@dataclass(frozen=True)
class Note:
    """A dry run's decision: the record's `why` changes and the decision is logged; nothing is written."""

    event: str
    why: str


@dataclass(frozen=True)
class Start:
    """Start a worker for the record without moving it."""

    work: Callable[[], object]


@dataclass(frozen=True)
class Gated:
    """The health gate returned `result`: recorded first, then `then` is carried out."""

    result: GateResult
    then: Move | Finish


Transition = Move | Finish | Note | Start | Gated | None


@dataclass(frozen=True)
class Returned:
    """What the record's worker (a provider's act, a gate) returned, or the error it raised."""

    value: Any  # the provider's result line, or the gate's GateResult
    error: BaseException | None = None


class Repairs(Protocol):
    """What of the controller (loop.py) the steps read: named here, so that this module does not import the loop
    that imports it."""

    @property
    def settings(self) -> ControllerSettings: ...
    @property
    def gate(self) -> Gate: ...
    def active_repairs(self) -> int: ...
    def provider_for(self, node: str) -> Provider: ...
    def come_back_timeout(self, node: str) -> float: ...
    def repairs_since(self, node: str, since: float) -> list[dict[str, Any]]: ...


StepFunction = Callable[[Repairs, RepairRecord, Look, "Returned | None", float], Transition]


def triage(ctl: Repairs, rec: RepairRecord, look: Look) -> Transition:
    """What ends a repair whatever its step: a node resumed by someone else, or a reason changed by someone else.
    The steps for a person are only watched here; None for the others: their step decides."""
    node, parsed = look.node, look.reason
    if rec.step in FOR_A_PERSON:
        if look.in_service:
            why = f"resumed by someone else after the controller left it for a person ({rec.step.value})"
            return Finish("lemon_cleared" if rec.step is Step.LEMON else "resumed_by_operator", why)
        if parsed.owner != "controller" and look.request is not None:
            return Finish("superseded", f"new request: {node.reason}")  # picked up afresh next cycle
        return None
    if rec.step is Step.GATING:
        # The slurm gate holds the node in service inside its reservation while its job runs (and after a
        # restart mid-gate until the gate runs again): the gate's result decides, not the node's state.
        return None
    if look.in_service and rec.step is not Step.ACTING:
        return Finish("resumed_outside_controller", f"node back in service without the controller ({node.state_text})")
    still_asked = parsed.action is not None if rec.step is not Step.PENDING else look.request is not None
    if parsed.owner is None and not still_asked:
        return Finish("taken_over", f"reason changed by someone else: {node.reason!r}")
    return None


def pending(ctl: Repairs, rec: RepairRecord, look: Look, returned: Returned | None, now: float) -> Transition:
    """Wait for the node's jobs (forced DOWN after forced_down_after_s) and for a repair slot; then drain the node
    and ask the provider for the ladder's action."""
    s, node = ctl.settings, look.node
    if node.is_busy:
        waited = now - rec.detected_at
        if waited >= s.forced_down_after_s and not rec.forced_down:
            why = f"forced down after {waited:.0f} s waiting for its jobs"
            reason = controller_reason(why, rec.requested)
            return Move(
                Step.PENDING,
                why,
                "node_forced_down",
                "warning",
                marks=(("down", reason),),
                update=_forced_down,
                extra={"waited_s": round(waited, 1)},
            )
        if not rec.why.startswith("waiting for its jobs") and not rec.forced_down:
            why = f"waiting for its jobs (forced down after {s.forced_down_after_s:g} s)"
            return Move(Step.PENDING, why, "repair_waiting_for_jobs", extra={"state": node.state_text})
        return None
    busy = ctl.active_repairs()
    if busy >= s.max_concurrent:
        if rec.why != "waiting for a repair slot":
            return Move(
                Step.PENDING, "waiting for a repair slot", "repair_waiting_for_slot", extra={"under_repair": busy}
            )
        return None
    action = rec.action = s.ladder[rec.rung]
    why = f"{action.value} (attempt {rec.attempt + 1}) via {rec.provider}"
    if s.dry_run:
        return Note("repair_would_start", f"would {why}") if rec.why != f"would {why}" else None
    slurmd, boot = node.slurmd_start_time, node.boot_time

    def acted(r: RepairRecord) -> None:
        r.attempt += 1
        r.slurmd_before, r.boot_before, r.acted_at = slurmd, boot, now

    return Move(
        Step.ACTING,
        f"provider asked to {why}",
        "repair_action_started",
        # Drain first: a node that slurmd re-registers must not take jobs before the health gate.
        marks=(("drain", controller_reason(f"repairing: {why}", rec.requested)),),
        update=acted,
        start=partial(ctl.provider_for(rec.node).act, node, action),
        extra={"state": node.state_text},
    )


def acting(ctl: Repairs, rec: RepairRecord, look: Look, returned: Returned | None, now: float) -> Transition:
    """The provider returned (or raised); a controller restarted while it acted waits for the node instead."""
    if returned is None:
        why = "controller restarted while the provider acted: waiting for the node rather than acting twice"
        return Move(Step.WAITING_BACK, why, "repair_action_resumed")
    if returned.error is not None:
        return attempt_failed(ctl, rec, f"provider {rec.provider} failed: {returned.error}", "provider_error", now)
    return Move(Step.WAITING_BACK, str(returned.value), "repair_action_done")


def waiting_back(ctl: Repairs, rec: RepairRecord, look: Look, returned: Returned | None, now: float) -> Transition:
    """Wait for slurmd to register again (then the gate starts), up to the node's come_back_timeout_s."""
    node = look.node
    if came_back(node, rec):
        return Move(
            Step.GATING,
            f"slurmd registered again ({node.state_text})",
            "node_came_back",
            start=partial(ctl.gate.check, node),
            extra={"waited_s": round(now - (rec.acted_at or now), 1)},
        )
    limit = ctl.come_back_timeout(rec.node)
    if now - (rec.acted_at or rec.step_since) > limit:
        return attempt_failed(ctl, rec, f"did not come back within {limit:g} s", "not_back", now)
    return None


def gating(ctl: Repairs, rec: RepairRecord, look: Look, returned: Returned | None, now: float) -> Transition:
    """The gate's result decides: failed, the next rung; passed, resumed (or left for a person if a lemon)."""
    if returned is None:  # restarted mid-gate: a health check is safe to run again
        return Start(partial(ctl.gate.check, look.node))
    err = returned.error
    result: GateResult = returned.value if err is None else GateResult(False, f"gate error: {err}", 0.0, time.time())
    rec.last_health = result.to_json()
    if not result.passed:
        return Gated(result, attempt_failed(ctl, rec, f"health gate failed: {result.detail}", "gate_failed", now))
    if look.reason.owner != "controller":
        why = f"health gate passed, but the reason is no longer ours: {look.node.reason!r}"
        return Gated(result, Finish("not_resumed_reason_changed", why))
    earlier = ctl.repairs_since(rec.node, now - ctl.settings.lemon_window_s)
    if len(earlier) + 1 >= ctl.settings.lemon_repairs:
        return Gated(result, left_for_a_person(ctl, rec, earlier))
    return Gated(result, Finish("repaired", f"health gate passed ({result.detail}); resumed", resume=True))


def left_for_a_person(ctl: Repairs, rec: RepairRecord, earlier: list[dict[str, Any]]) -> Move:
    """A lemon: the node passes its gate but keeps coming back. It stays drained for a person, with its
    repairs in the reason (Slurm clips reasons at 200 characters: the count comes first)."""
    days = ctl.settings.lemon_window_s / 86400
    shown = [
        f"{h.get('requested', '?')} {time.strftime('%m-%d %H:%M', time.localtime(h['at']))}" for h in earlier[-4:]
    ] + [f"{rec.current.value} now"]
    text = f"repaired {len(earlier) + 1} times within {days:g} d: {', '.join(shown)}"
    return Move(
        Step.LEMON,
        f"needs a person: {text}",
        "node_left_for_a_person",
        "error",
        marks=(("drain", person_reason(text)),),
        outcome="lemon",
        extra={"repairs": len(earlier) + 1, "last_health": rec.last_health},
    )


def attempt_failed(ctl: Repairs, rec: RepairRecord, why: str, kind: str, now: float) -> Move:
    """The next rung of the ladder, or past the last one: given up, DOWN+DRAIN with a reason for a person."""
    rec.rung += 1
    ladder = ctl.settings.ladder
    if rec.rung < len(ladder):
        return Move(
            Step.PENDING, f"escalating to {ladder[rec.rung].value}: {why}", "repair_escalated", "warning", failed=kind
        )
    # What a person must know comes first: Slurm reasons are clipped at 200 characters.
    text = f"needs a person: gave up after {rec.attempt} attempt(s): {why}"
    reason = controller_reason(text)  # no Action: word, so nothing picks it up again by itself
    return Move(
        Step.GIVEN_UP,
        text,
        "repair_given_up",
        "error",
        # DOWN alone would be undone by ReturnToService once slurmd answers; DRAIN keeps it out.
        marks=(("down", reason), ("drain", reason)),
        failed=kind,
        outcome="given_up",
        extra={"last_health": rec.last_health},
    )


def came_back(node: Node, rec: RepairRecord) -> bool:
    """slurmd registered since the provider acted: a new slurmd start or boot time, and it answers."""
    if node.has("NOT_RESPONDING", "POWERING_UP", "REBOOT_ISSUED") or node.slurmd_start_time is None:
        return False
    return node.slurmd_start_time != rec.slurmd_before or (
        node.boot_time is not None and rec.boot_before is not None and node.boot_time != rec.boot_before
    )


def _forced_down(rec: RepairRecord) -> None:
    rec.forced_down = True


# The steps the loop drives, each to its one function; the steps for a person have none (`triage` only watches
# them). Checked by a test: a step added to Step without a function here, or one for a person, fails it.
STEP_FUNCTIONS: dict[Step, StepFunction] = {
    Step.PENDING: pending,
    Step.ACTING: acting,
    Step.WAITING_BACK: waiting_back,
    Step.GATING: gating,
}
