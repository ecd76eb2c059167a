"""A node released from the job and taken back within the second is launched on only once that second has passed
(hpresilience/autoresume/decide/rejoin.py): slurmd refuses a step credential from the second of the release."""

from __future__ import annotations

import json
from pathlib import Path

from hpresilience.autoresume.decide.rejoin import REVOKE_MARGIN_S, wait_out_revocation
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
