"""The in-process recovery's guard (autoresume/inprocessguard.py): when a recovery is over (rank 0's formed-world
report), and when it must fall back (a second fault before then, or its bound passed)."""

from __future__ import annotations

import json
from pathlib import Path

from hpresilience.autoresume.inprocessguard import RecoveryGuard
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.torch.worldreport import Formed, report_path, write_formed


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def guard(tmp_path: Path, clock: Clock) -> tuple[RecoveryGuard, Reporter]:
    reporter = Reporter(WrapperStateStore(tmp_path, 7), 7, None)
    return RecoveryGuard(str(tmp_path / "7.world.json"), 30.0, reporter, clock), reporter


def events(tmp_path: Path, name: str) -> list[dict[str, object]]:
    lines = (tmp_path / "7.events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def test_a_fault_while_a_recovery_has_not_formed_is_a_second_fault_and_one_after_it_formed_is_not(
    tmp_path: Path,
) -> None:
    clock = Clock()
    g, _ = guard(tmp_path, clock)
    assert g.second_fault(["n2"]) is None  # no recovery running
    g.recovering(2)
    clock.now += 1.5
    why = g.second_fault(["n3"])
    assert why == "a second fault (on n3) while the recovery into generation 2 was still running (1.5 s in)"
    write_formed(tmp_path / "7.world.json", Formed(2, 12, "collective_failed", 1.0, 1.1, 2.0, 2.2, 2.5, state_to=2))
    assert g.second_fault(["n3"]) is None
    (said,) = events(tmp_path, "inprocess_world_formed")
    assert (said["generation"], said["step"], said["state_to"], said["new_world_s"]) == (2, 12, 2, 0.9)


def test_a_recovery_that_has_not_formed_within_its_bound_falls_back_and_one_that_formed_in_time_does_not(
    tmp_path: Path,
) -> None:
    clock = Clock()
    g, _ = guard(tmp_path, clock)
    g.recovering(2)
    clock.now += 30
    assert g.poll() is None
    clock.now += 0.5
    assert g.poll() == "generation 2's world did not form within 30 s (inprocess_recovery_s)"
    write_formed(tmp_path / "7.world.json", Formed(2, 12, "new_world", 1.0, 1.1, 2.0, 2.2, 2.5))
    assert g.poll() is None and g.pending is None


def test_a_malformed_report_is_said_and_left_to_the_bound(tmp_path: Path) -> None:
    clock = Clock()
    g, _ = guard(tmp_path, clock)
    g.recovering(2)
    Path(report_path(tmp_path / "7.world.json")).write_text('{"generation": 2}')
    assert g.poll() is None and g.pending == 2
    assert events(tmp_path, "inprocess_report_unreadable")
    clock.now += 31
    assert g.poll() is not None
