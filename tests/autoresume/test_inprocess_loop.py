"""The in-process loop's order of looks (autoresume/inprocess.py), on fakes: what it does with the steps' ends
before its watches judge a silence. The loop against Slurm: test_inprocess*_integration.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hpresilience.autoresume.inprocess import Fallback, InProcessLoop

PLAN = ["n1", "n3", "n2"]


class Steps:
    """The per-node steps: each look's ended steps in turn, none running."""

    def __init__(self, *looks: dict[str, int]) -> None:
        self.looks = list(looks)
        self.running: dict[str, Any] = {}

    def ended(self) -> dict[str, int]:
        return self.looks.pop(0) if self.looks else {}


def loop_with(steps: Steps, dead: dict[str, str], calls: list[str]) -> InProcessLoop:
    loop = object.__new__(InProcessLoop)
    loop.sup = SimpleNamespace(  # type: ignore[assignment]
        stop_request=SimpleNamespace(signum=0), state=SimpleNamespace(finished=False, exit_code=None)
    )
    loop.reporter = SimpleNamespace(decision=lambda event, **kw: calls.append(event))  # type: ignore[assignment]
    loop.steps = steps  # type: ignore[assignment]
    loop.plan = list(PLAN)
    loop.generation = 4
    loop.faults = SimpleNamespace(poll=lambda now, view: None)  # type: ignore[assignment]
    loop.guard = SimpleNamespace(poll=lambda: None, pending=None)  # type: ignore[assignment]

    def ended_badly(ended: dict[str, int], finished: set[str]) -> dict[str, str]:
        # As _dead does for a returned node's step that Slurm's delayed termination ended after the training:
        # it waits out the node's quiet (11 s, in which the other nodes finish) and counts it finished.
        calls.append("dead")
        finished.update(n for n in ended if n not in dead)
        return {n: dead[n] for n in ended if n in dead}

    def hung() -> dict[str, str]:
        calls.append("hang watch")
        raise Fallback("a hang (no progress for 13 s) that names no single node")

    def replace(failed: dict[str, str], finished: set[str]) -> list[int]:
        calls.append(f"replace {','.join(sorted(failed))}")
        return []

    loop._dead = ended_badly  # type: ignore[method-assign]
    loop._stalled = lambda: {}  # type: ignore[method-assign]
    loop._hung = hung  # type: ignore[method-assign]
    loop._replace = replace  # type: ignore[method-assign]
    loop._watch_world = lambda new_slots: None  # type: ignore[method-assign]
    loop._view = lambda: None  # type: ignore[method-assign,assignment,return-value]
    return loop


def test_a_step_ended_after_the_training_lets_the_others_ends_be_seen_before_any_watch_judges_the_silence() -> None:
    """A returned node's step ended by Slurm's delayed termination after the training: the loop waited (its quiet),
    the other nodes finished meanwhile, and the next look ends the job; the hang watch, which would have taken the
    wait's silence with every rank exited for a hang and relaunched a finished job, is not asked in between."""
    calls: list[str] = []
    loop = loop_with(Steps({"n3": 137}, {"n1": 0, "n2": 0}), {}, calls)
    finished: set[str] = set()
    assert loop._look(finished) is None
    assert loop._look(finished) == 0
    assert calls == ["dead", "job_step_succeeded"]
    assert loop.sup.state.finished is True and loop.sup.state.exit_code == 0


def test_a_step_that_ended_on_a_dead_node_is_replaced_in_the_same_look() -> None:
    calls: list[str] = []
    loop = loop_with(Steps({"n3": 137}), {"n3": "its step ended with exit status 137 and it runs no task"}, calls)
    assert loop._look(set()) is None
    assert calls == ["dead", "replace n3"]


def test_with_no_step_ended_the_hang_watch_is_asked_and_its_fallback_stands() -> None:
    calls: list[str] = []
    loop = loop_with(Steps(), {}, calls)
    with pytest.raises(Fallback, match="names no single node"):
        loop._look(set())
    assert calls == ["hang watch"]
