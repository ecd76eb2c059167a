"""The ledger's in-process recovery kind (`--auto-resume-mode=inprocess`, issue 33): a fault the job recovered
from without relaunching, and its parts.

The in-process mode writes no `attempt_started`: its one attempt is its first world (`inprocess_world_written`,
generation 1), and its recoveries happen inside that attempt while the survivors keep training. Each recovery
is read from the records the mode writes:

    fault (Slurm's mark: node_fault_seen less its detection latency; else the wrapper's fault_seen)
      -> fault_seen (the wrapper decided)                                    detect
      -> inprocess_replaced (old step cancelled, spare taken, world written,
         replacement's step launched)                                        replace (the wrapper's part)
    rank 0's own times, from the formed-world report (inprocess_world_formed; hpresilience/torch/worldreport.py):
      started_at -> torn_down_at                                             teardown
      torn_down_at -> joined_at (includes waiting for the replacement)       new_world
      joined_at -> agreed_at (step agreed, state sent to the new ranks)      state_transfer
      agreed_at -> first_step_at (the first step in the new world)           first_step

In the totals, fault -> fault_seen is `detection` and fault_seen -> first_step_at is `inprocess_recovery` (the
first step after is in it: it is at most the step in flight computed again); the rest of the attempt stays
productive, which is what no rollback means (lost work 0). Those seconds are moved out of the attempt's
productive time, never more than it has, so the categories still sum to the wall time. A recovery that never
formed is the fallback's (`inprocess_fallback`): the relaunch path's attempt after it accounts it as a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpresilience.goodput.ledgertypes import MAX_CAUSE_CHARS, MAX_FAULT_NODES, Badput, Ledger, Restart, names, num

ACTION = "inprocess"
# The records this module reads (ledgerread.py keeps their keys).
EVENTS = ("inprocess_world_written", "inprocess_replaced", "inprocess_world_formed", "inprocess_fallback")
FORMED_TIMES = ("started_at", "torn_down_at", "joined_at", "agreed_at", "first_step_at")


@dataclass(slots=True)
class InProcessRecovery:
    fault: dict[str, Any]  # the wrapper's fault_seen (mode inprocess)
    marks: list[float] = field(default_factory=list)  # when Slurm marked a node of it bad
    replaced: float | None = None
    formed: dict[str, Any] | None = None  # inprocess_world_formed of the generation it built

    def fault_at(self) -> float:
        decided = num(self.fault, "time") or 0.0
        return min([decided, *self.marks])


def first_world(record: Mapping[str, Any]) -> bool:
    """Whether `record` starts an in-process attempt (its first world)."""
    return record.get("event") == "inprocess_world_written" and record.get("generation") == 1


def progress_of(formed: Mapping[str, Any]) -> dict[str, Any] | None:
    """Generation 1's formed report as the attempt's first progress (its first step's end), as attempt_progress
    says it for the relaunch path."""
    at, step = num(formed, "first_step_at"), num(formed, "step")
    if at is None or step is None:
        return None
    return {"first_progress_at": at, "first_step": int(step) + 1}


def _times(formed: Mapping[str, Any]) -> list[float] | None:
    times = [num(formed, key) for key in FORMED_TIMES]
    return [t for t in times if t is not None] if all(t is not None for t in times) else None


def parts(r: InProcessRecovery) -> dict[str, float] | None:
    """The recovery's parts in seconds (None: it never formed)."""
    times = _times(r.formed or {})
    decided = num(r.fault, "time")
    if times is None or decided is None:
        return None
    started, torn, joined, agreed, first = times
    fault_at = r.fault_at()
    replaced = max(decided, r.replaced if r.replaced is not None else decided)
    return {
        "detect_s": max(0.0, decided - fault_at),
        "replace_s": replaced - decided,
        "teardown_s": max(0.0, torn - started),
        "new_world_s": max(0.0, joined - torn),
        "state_transfer_s": max(0.0, agreed - joined),
        "first_step_s": max(0.0, first - agreed),
        "recovery_s": max(0.0, first - fault_at),
    }


def account(ledger: Ledger, attempts: Iterable[tuple[int, list[InProcessRecovery]]], end: float) -> None:
    """Each formed recovery of each attempt into the ledger: its seconds moved out of productive, a Restart
    (numbered by the world it built, as the wrapper counts attempts in this mode)."""
    for _, recoveries in attempts:
        for r in recoveries:
            found = parts(r)
            if found is None:
                continue
            fault_at, decided = r.fault_at(), num(r.fault, "time") or 0.0
            first = min(end, fault_at + found["recovery_s"])
            cost: dict[str, float] = {}
            for category, seconds in (
                (Badput.DETECTION, min(first, decided) - fault_at),
                (Badput.INPROCESS, first - max(fault_at, decided)),
            ):
                moved = min(max(0.0, seconds), ledger.productive_s)
                ledger.productive_s -= moved
                ledger.add(category, moved)
                if moved > 0:
                    cost[category.value] = moved
            ledger.restarts.append(
                Restart(
                    at=fault_at,
                    attempt=int(num(r.formed or {}, "generation") or 0),  # the world it built
                    cause=str(r.fault.get("cause") or "unknown")[:MAX_CAUSE_CHARS],
                    nodes=names(r.fault.get("nodes"), MAX_FAULT_NODES),
                    action=ACTION,
                    lost_s=0.0,
                    badput_s=sum(cost.values()),
                    by_category=cost,
                    parts=found,
                )
            )
    ledger.restarts.sort(key=lambda r: r.at)
