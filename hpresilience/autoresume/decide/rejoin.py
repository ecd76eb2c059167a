"""Nodes that left the job and joined it again.

A node released and taken back within a second: its next step is refused.

When the job shrinks off a node, slurmctld's REQUEST_TERMINATE_JOB carries its own time (whole seconds) and slurmd
revokes the job's credentials up to it (`slurm_cred_revoke`); a step credential created in that same second is
then refused (`cred->ctime <= revoked`): `srun: error: Task launch for StepId=J.S failed on node n2: Job credential
revoked`, and the step never starts. Seen in CI on 22.05: n2 released at 22:33:26.16, grown back into the job at
26.78 (the failed node, repaired, is its own replacement), its step launched at 26.81 and refused. A step created
in a later second than the release passes, so a node released this recently is launched on only once that second
has passed, with REVOKE_MARGIN_S for the clock of the host this runs on against slurmctld's.

A node taken back after it left the job unanswering gets Slurm's delayed termination of the job later, which kills
the step on it (autoresume/inprocess.py): which such ended steps are started again (sort_ended).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hpresilience.autoresume.report import Reporter
from hpresilience.slurm.hostlist import compress

REVOKE_MARGIN_S = 0.5


def wait_out_revocation(
    released_at: Mapping[str, float],
    nodes: Sequence[str],
    reporter: Reporter,
    *,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Before a step on `nodes`: wait until the second after the latest release of any of them (wall clock,
    `released_at`: when each was released from the job) has begun, plus the margin. The seconds waited."""
    latest = max((released_at[n] for n in nodes if n in released_at), default=None)
    if latest is None:
        return 0.0
    wait = math.floor(latest) + 1 + REVOKE_MARGIN_S - now()
    if wait <= 0:
        return 0.0
    reporter.decision(
        "rejoined_nodes_waited_for_credentials",
        nodes=compress([n for n in nodes if n in released_at]),
        waited_s=round(wait, 3),
    )
    sleep(wait)
    return wait


@dataclass(frozen=True)
class EndedSteps:
    """Steps that ended badly on nodes that answer, sorted (sort_ended)."""

    again: list[str]  # Slurm's delayed termination on a node back in the job: its slot starts again
    finished: list[str]  # killed so, once every other node had finished the training: finished too
    failed: list[str]  # none of those: an application error


def sort_ended(
    answering: Sequence[str],
    rejoined: Mapping[str, tuple[float, int]],
    finished: set[str],
    plan: Sequence[str],
    now: float,
    window_s: float,
    max_relaunches: int,
) -> EndedSteps:
    """`answering`: nodes whose step ended badly though they answer. One back in the world within `window_s`
    (`rejoined`: node -> (when, relaunches since)) and relaunched fewer than `max_relaunches` times is started
    again; but when every other node of the plan has finished the training, this node's ranks were in every
    step's all-reduce to the last (the others could not have finished without them), so it finished too: seen in
    CI, the termination came 1.2 s after all six ranks printed their final weights, and the relaunched ranks
    waited for a world that no survivor would join."""
    again = [
        n for n in answering if n in rejoined and now - rejoined[n][0] < window_s and rejoined[n][1] < max_relaunches
    ]
    failed = [n for n in answering if n not in again]
    if again and not failed and finished >= set(plan) - set(again):
        return EndedSteps([], again, [])
    return EndedSteps(again, [], failed)
