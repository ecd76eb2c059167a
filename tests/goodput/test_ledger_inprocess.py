"""The ledger's in-process recovery kind (goodput/inprocessparts.py): a job of `--auto-resume-mode=inprocess`
is one attempt whose recoveries are restarts of action `inprocess`, with their parts; a recovery that fell back
is the relaunch path's restart. Synthetic timelines whose every second is known, in the records' real shape,
and a recording of a real in-process run (tests/fixtures/goodput)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpresilience.goodput.ledger import compute, render
from hpresilience.goodput.ledgerread import _project
from tests.goodput.test_ledger import T0, ev

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "goodput"


def formed(t: float, generation: int, step: int, times: tuple[float, float, float, float, float]) -> dict[str, Any]:
    keys = ("started_at", "torn_down_at", "joined_at", "agreed_at", "first_step_at")
    return ev(
        t,
        "inprocess_world_formed",
        generation=generation,
        step=step,
        **{k: T0 + v for k, v in zip(keys, times, strict=True)},
    )


def one_recovery() -> list[dict[str, Any]]:
    """World 1 written at 0, its first step done at 10; n2 marked at 30 (seen at 31), replaced at 32; rank 0 saw
    the collective fail at 31.5, tore down by 31.6, joined at 34, agreed at 34.5, first step after at 35; the
    job ends at 60."""
    return [
        ev(0, "supervisor_started"),
        ev(0, "inprocess_world_written", generation=1, nodes="n1,n2"),
        formed(10.1, 1, 0, (5, 5, 9, 9, 10)),
        ev(31, "node_fault_seen", node="n2", detection_latency_s=1.0),
        ev(31, "fault_seen", cause="hardware", mode="inprocess", nodes="n2"),
        ev(31.9, "inprocess_world_written", generation=2, nodes="n1,n3"),
        ev(32, "inprocess_replaced", generation=2, nodes="n1,n3", replaced="n2"),
        formed(35.1, 2, 20, (31.5, 31.6, 34, 34.5, 35)),
        ev(60, "job_step_succeeded", mode="inprocess"),
    ]


def test_an_in_process_job_is_one_attempt_and_its_recovery_a_restart_with_its_parts_and_no_lost_work() -> None:
    led = compute(7, one_recovery())
    assert led.attempts == 1 and led.ended and led.wall_s == pytest.approx(60)
    (r,) = led.restarts
    assert (r.action, r.cause, r.nodes, r.lost_s, r.attempt) == ("inprocess", "hardware", ["n2"], 0.0, 2)
    assert r.at == pytest.approx(T0 + 30)
    assert r.parts == pytest.approx(
        {
            "detect_s": 1.0,
            "replace_s": 1.0,
            "teardown_s": 0.1,
            "new_world_s": 2.4,
            "state_transfer_s": 0.5,
            "first_step_s": 0.5,
            "recovery_s": 5.0,
        }
    )
    assert r.by_category == pytest.approx({"detection": 1.0, "inprocess_recovery": 4.0})
    b = led.badput_s
    assert b["detection"] == pytest.approx(1) and b["inprocess_recovery"] == pytest.approx(4)
    assert b["reinit"] == pytest.approx(10) and b["lost_work"] == 0  # start to the first step; nothing redone
    assert led.productive_s == pytest.approx(60 - 10 - 5)
    assert led.productive_s + sum(b.values()) == pytest.approx(led.wall_s)
    assert "-> inprocess, lost work 0.0 s, cost 5.0 s" in render(led)
    assert r.to_dict()["parts"]["recovery_s"] == 5.0


def test_a_recovery_that_fell_back_is_the_relaunch_paths_restart_and_its_in_process_time_is_its_own_category() -> None:
    """A second fault at 33 during the recovery of the fault at 30: no world formed, the wrapper falls back at 34
    and the relaunch path starts at 35 (attempt 3), resumes after step 15 and ends at 70."""
    events = [
        *one_recovery()[:7],
        ev(33, "node_fault_seen", node="n3", detection_latency_s=0.2),
        ev(33, "fault_seen", cause="hardware", mode="inprocess", nodes="n3"),
        ev(34, "inprocess_fallback", generation=2, why="a second fault"),
        ev(35, "attempt_started", attempt=3, nodes="n1,n4"),
        ev(
            70,
            "attempt_ended",
            attempt=3,
            decided_at=T0 + 70,
            first_progress_at=T0 + 46,
            first_step=16,
            last_progress_at=T0 + 70,
            last_step=60,
            step_s=1.0,
        ),
        ev(70, "job_step_succeeded"),
    ]
    led = compute(7, events)
    assert led.attempts == 2
    (r,) = led.restarts
    assert (r.action, r.cause, r.attempt, r.parts) == ("relaunch", "inprocess_fallback", 2, {})
    assert r.at == pytest.approx(T0 + 30)  # the first fault's mark
    assert led.badput_s["detection"] == pytest.approx(1)  # 30 -> 31
    assert led.badput_s["inprocess_recovery"] == pytest.approx(3)  # 31 -> 34: in vain
    # Each attempt's start to its first step's start (a typical step is 1 s): 0 -> 9 and 35 -> 45.
    assert led.badput_s["reinit"] == pytest.approx(9 + 10)
    assert led.badput_s["lost_work"] == pytest.approx(6)  # steps 16-21 (24 -> 30) are done again after step 15
    assert led.productive_s + sum(led.badput_s.values()) == pytest.approx(led.wall_s)


def test_the_in_process_records_keep_what_the_ledger_reads_through_roots_reader() -> None:
    """Root reads the events through ledgerread's projection: the parts' times must survive it."""
    kept = [p for e in one_recovery() if (p := _project(json.loads(json.dumps(e)))) is not None]
    assert compute(7, kept).restarts[0].parts == compute(7, one_recovery()).restarts[0].parts


def test_a_recorded_in_process_run_shows_its_recovery_in_the_ledger() -> None:
    """Events of a real run (tests/autoresume/test_inprocess_fallback_integration.py's Action:Replace on the
    devcluster, recorded): one attempt, one in-process restart whose parts add up to its recovery time."""
    events = [json.loads(line) for line in (FIXTURES / "inprocess-replace.events.jsonl").read_text().splitlines()]
    led = compute(26200000, events)
    assert led.attempts == 1 and led.ended
    (r,) = led.restarts
    assert r.action == "inprocess" and r.nodes == ["n2"] and r.lost_s == 0.0
    p = r.parts
    assert p["recovery_s"] > 0 and all(v >= 0 for v in p.values())
    assert r.badput_s == pytest.approx(p["recovery_s"], abs=0.01)
    assert led.productive_s + sum(led.badput_s.values()) == pytest.approx(led.wall_s)


@pytest.mark.parametrize("times", [(31.5, 31.6, 34, 34.5, 1e12), (31.5, 20, 10, 5, 0), (-1e14, 0, 0, 0, 1e14)])
def test_a_formed_record_with_times_out_of_order_or_out_of_range_keeps_every_category_within_the_wall_time(
    times: tuple[float, float, float, float, float],
) -> None:
    """Root computes this ledger from the job's user's file: whatever the times say, no category is negative and
    productive time plus the categories is the wall time."""
    events = one_recovery()
    events[7] = formed(35.1, 2, 20, times)
    led = compute(7, events)
    assert all(v >= 0 for v in led.badput_s.values()) and led.productive_s >= 0
    assert led.productive_s + sum(led.badput_s.values()) == pytest.approx(led.wall_s)
    assert all(v >= 0 for r in led.restarts for v in r.parts.values())
