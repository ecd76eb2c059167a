"""What a verdict means for the job, once its step has ended: the one table the supervisor follows.

A planned move (a MOVE verdict that knows where the step goes, or which nodes it leaves) is not a fault: the
step moves, and the restart budget is not charged. Everything else is a step that ended by itself or was stopped
for a fault: ending.py says why (a `Cause`), the restart policy weighs that kind of failure against its budget
(policy.py), and the policy's action says what happens next:

| why the step ended                | outcome                                                         |
|-----------------------------------|-----------------------------------------------------------------|
| MOVE verdict (drained, grow back) | move: reap, recover the leaving nodes' slots, relaunch          |
| succeeded (Cause.NONE)            | finish: the job step ends 0                                     |
| a fault, policy RESTART_STEP      | relaunch (hardware: bad nodes swapped out; others: same nodes)  |
| a fault, policy FULL_RESTART      | requeue the whole job                                           |
| a fault, policy GIVE_UP           | give up: the job step ends with the step's exit code            |
"""

from __future__ import annotations

import enum

from hpresilience.autoresume.decide.classify import Cause
from hpresilience.autoresume.decide.policy import FailureKind, PolicyChoice
from hpresilience.autoresume.watch.base import Act, AttemptResult


class Outcome(enum.Enum):
    MOVE = "move"
    FINISH = "finish"
    RELAUNCH = "relaunch"
    REQUEUE = "requeue"
    GIVE_UP = "give_up"


# The kind of failure the restart policy weighs for each cause.
KIND_OF: dict[Cause, FailureKind] = {
    Cause.HARDWARE: FailureKind.NODE_FAULT,
    Cause.HANG: FailureKind.RULE_TRIPPED,
    Cause.SLOW: FailureKind.RULE_TRIPPED,
    Cause.COLLECTIVE: FailureKind.RULE_TRIPPED,
    Cause.APPLICATION: FailureKind.APPLICATION_ERROR,
    Cause.INTEGRITY: FailureKind.RULE_TRIPPED,
    Cause.DIVERGED: FailureKind.DIVERGED,
    Cause.CRASH_LOOP: FailureKind.APPLICATION_ERROR,
    Cause.RERUN: FailureKind.RERUN_REQUESTED,
}

# The restart policy's action for a fault.
OUTCOME_OF: dict[PolicyChoice, Outcome] = {
    PolicyChoice.RESTART_STEP: Outcome.RELAUNCH,
    PolicyChoice.FULL_RESTART: Outcome.REQUEUE,
    PolicyChoice.GIVE_UP: Outcome.GIVE_UP,
}


def is_move(result: AttemptResult) -> bool:
    """A planned move the supervisor can carry out: it knows where to (grow back) or which nodes leave."""
    v = result.verdict
    return v is not None and v.act is Act.MOVE and (v.target is not None or bool(v.nodes))


def after_diagnosis(cause: Cause) -> Outcome | None:
    """FINISH for a step that succeeded; None: a fault, for the restart policy to weigh (`OUTCOME_OF`)."""
    return Outcome.FINISH if cause is Cause.NONE else None
