"""A node released from the job and taken back within the second is launched on only once that second has passed
(hpresilience/autoresume/decide/rejoin.py): slurmd refuses a step credential from the second of the release."""

from __future__ import annotations

import json
from pathlib import Path

from hpresilience.autoresume.decide.rejoin import REVOKE_MARGIN_S, EndedSteps, sort_ended, wait_out_revocation
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperStateStore


def reporter(tmp_path: Path) -> tuple[Reporter, Path]:
    store = WrapperStateStore(tmp_path, 7)
    return Reporter(store, 7, None), store.events_path


def test_a_node_released_in_this_second_is_launched_on_only_after_the_next_second_begins(tmp_path: Path) -> None:
    rep, events = reporter(tmp_path)
    slept: list[float] = []
    waited = wait_out_revocation(
        {"n2": 1000.16, "n3": 990.0}, ["n2", "n4"], rep, now=lambda: 1000.78, sleep=slept.append
    )
    assert slept == [waited] and abs(waited - (1001 + REVOKE_MARGIN_S - 1000.78)) < 1e-9
    said = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(e["event"], e["nodes"]) for e in said] == [("rejoined_nodes_waited_for_credentials", "n2")]


def test_a_node_released_seconds_ago_or_never_costs_no_wait(tmp_path: Path) -> None:
    rep, _ = reporter(tmp_path)
    slept: list[float] = []
    assert wait_out_revocation({"n2": 997.9}, ["n2"], rep, now=lambda: 1000.0, sleep=slept.append) == 0.0
    assert wait_out_revocation({"n2": 999.9}, ["n3"], rep, now=lambda: 1000.0, sleep=slept.append) == 0.0
    assert slept == []


PLAN = ["n1", "n2", "n3"]
BACK = {"n3": (100.0, 0)}  # n3 left the job unanswering and came back into the world at t=100


def test_a_step_killed_on_a_node_back_in_the_job_starts_again_while_the_training_runs() -> None:
    steps = sort_ended(["n3"], BACK, set(), PLAN, now=110.0, window_s=120.0, max_relaunches=3)
    assert steps == EndedSteps(again=["n3"], finished=[], failed=[])


def test_once_every_other_node_finished_the_training_such_a_step_counts_as_finished() -> None:
    steps = sort_ended(["n3"], BACK, {"n1", "n2"}, PLAN, now=110.0, window_s=120.0, max_relaunches=3)
    assert steps == EndedSteps(again=[], finished=["n3"], failed=[])
    # One other node still training: the slot starts again.
    steps = sort_ended(["n3"], BACK, {"n1"}, PLAN, now=110.0, window_s=120.0, max_relaunches=3)
    assert steps.again == ["n3"] and not steps.finished


def test_a_step_that_ends_badly_on_a_node_not_back_or_past_its_bounds_is_an_application_error() -> None:
    assert sort_ended(["n2"], BACK, set(), PLAN, 110.0, 120.0, 3).failed == ["n2"]  # never left the job
    assert sort_ended(["n3"], BACK, set(), PLAN, 221.0, 120.0, 3).failed == ["n3"]  # past the window
    assert sort_ended(["n3"], {"n3": (100.0, 3)}, set(), PLAN, 110.0, 120.0, 3).failed == ["n3"]  # relaunched 3 times
    # An application error beside it is not hidden by the others having finished.
    steps = sort_ended(["n2", "n3"], BACK, {"n1"}, PLAN, 110.0, 120.0, 3)
    assert steps.failed == ["n2"] and not steps.finished
