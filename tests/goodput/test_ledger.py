"""The goodput ledger computed from decision records: synthetic timelines whose every second is known."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hpresilience.goodput.ledger import Ledger, compute, render

T0 = 1_700_000_000.0


def ev(t: float, event: str, **fields: Any) -> dict[str, Any]:
    return {"time": T0 + t, "event": event, "job_id": 7, **fields}


def ended(
    t: float,
    attempt: int,
    decided: float,
    first: tuple[float, int] | None,
    last: tuple[float, int] | None,
    step_s: float | None,
) -> dict[str, Any]:
    return ev(
        t,
        "attempt_ended",
        attempt=attempt,
        decided_at=T0 + decided,
        first_progress_at=T0 + first[0] if first else None,
        first_step=first[1] if first else None,
        last_progress_at=T0 + last[0] if last else None,
        last_step=last[1] if last else None,
        step_s=step_s,
    )


def one_fault(*, requeue: bool = False) -> list[dict[str, Any]]:
    """Attempt 1: launched 0, step 1 at 10, 1 s steps, node n2 marked at 30 (seen at 31), old tasks gone at 32,
    relaunched at 35 on other nodes; attempt 2 resumes after checkpoint 10 (first step 11 at 45), ends at 71."""
    out = [
        ev(0, "supervisor_started"),
        ev(0, "attempt_started", attempt=1, nodes="n1,n2"),
        ev(31, "node_fault_seen", node="n2", detection_latency_s=1.0),
        ended(31.1, 1, 31, (10, 1), (30.5, 21), 1.0),
        ev(31.2, "fault_seen", cause="hardware", nodes="n2", attempt=1),
        ev(32, "old_tasks_checked"),
    ]
    if requeue:
        out += [ev(33, "no_replacement"), ev(33, "job_requeue_requested"), ev(40, "supervisor_started")]
    else:
        out += [ev(35, "step_relaunching", nodes="n1,n3")]
    out += [
        ev(35, "attempt_started", attempt=2, nodes="n1,n3"),
        ended(71, 2, 71, (45, 11), (70, 36), 1.0),
        ev(71, "job_step_succeeded", attempt=2),
    ]
    return out


def test_each_second_of_a_relaunch_lands_in_its_category_and_the_parts_sum_to_the_wall_time() -> None:
    led = compute(7, one_fault())
    b = led.badput_s
    assert led.wall_s == pytest.approx(71)
    assert b["reinit"] == pytest.approx(18)  # 0 -> 9 and 35 -> 44 (the first step's start)
    assert led.productive_s == pytest.approx(36)  # steps 1..10 kept, then 11..36
    assert b["lost_work"] == pytest.approx(11)  # steps 11..20 and the part of 21 before the fault
    assert b["detection"] == pytest.approx(1) and b["stop"] == pytest.approx(1)
    assert b["replacement"] == pytest.approx(3) and b["other"] == pytest.approx(1)
    assert led.productive_s + sum(b.values()) == pytest.approx(led.wall_s)
    (r,) = led.restarts
    assert (r.cause, r.nodes, r.action) == ("hardware", ["n2"], "relaunch") and r.lost_s == pytest.approx(11)
    assert r.badput_s == pytest.approx(11 + 1 + 1 + 3 + 9)  # lost, detection, stop, replacement, reinit
    assert {k: v for k, v in r.to_dict()["by_category"].items()} == {
        "lost_work": 11,
        "detection": 1,
        "stop": 1,
        "replacement": 3,
        "reinit": 9,
    }
    assert led.ended and led.lost_work_known


def test_a_requeue_counts_from_the_request_to_the_next_launch() -> None:
    led = compute(7, one_fault(requeue=True))
    assert led.badput_s["requeue"] == pytest.approx(2)  # 33 -> 35
    assert led.badput_s["replacement"] == pytest.approx(1)  # 32 -> 33, looking for a node in vain
    assert led.restarts[0].action == "requeue" and led.ended


def test_steps_kept_past_the_fault_are_work_not_detection() -> None:
    """A node marked bad while the step trains on and saves: the steps the next attempt did not redo count."""
    events = one_fault()
    events[3] = ended(31.1, 1, 32, (10, 1), (31.5, 22), 1.0)  # marked at 30, stopped at 32
    events[-2] = ended(71, 2, 71, (45, 23), (58, 36), 1.0)  # resumed after step 22, saved at 31
    led = compute(7, events)
    assert led.badput_s["lost_work"] == pytest.approx(0)
    assert led.badput_s["detection"] == pytest.approx(1)  # 31 (end of step 22) -> 32
    assert led.productive_s + sum(led.badput_s.values()) == pytest.approx(led.wall_s)


def test_a_hang_starts_at_the_last_progress() -> None:
    events = [
        ev(0, "attempt_started", attempt=1, nodes="n1"),
        ended(60, 1, 60, (10, 1), (20, 11), 1.0),
        ev(60.5, "fault_seen", cause="hang", nodes=""),
        ev(61, "old_tasks_checked"),
        ev(61, "step_relaunching", nodes="n1"),
        ev(61, "attempt_started", attempt=2, nodes="n1"),
        ended(80, 2, 80, (70, 6), (79, 15), 1.0),
        ev(80, "job_step_succeeded"),
    ]
    led = compute(7, events)
    assert led.badput_s["detection"] == pytest.approx(40)
    assert led.restarts[0].lost_s == pytest.approx(6)  # 5 steps kept (1..5), 14 -> 20 redone


def test_a_step_without_progress_reports_gets_the_wrappers_categories_and_says_lost_work_is_unknown() -> None:
    events = [
        ev(0, "attempt_started", attempt=1, nodes="n1"),
        ended(50, 1, 50, None, None, None),
        ev(50, "fault_seen", cause="application", nodes=""),
        ev(52, "old_tasks_checked"),
        ev(52, "step_relaunching", nodes="n1"),
        ev(53, "attempt_started", attempt=2, nodes="n1"),
        ended(90, 2, 90, None, None, None),
        ev(90, "job_step_succeeded"),
    ]
    led = compute(7, events)
    assert not led.lost_work_known and not led.progress_seen
    assert led.productive_s == pytest.approx(87) and led.badput_s["stop"] == pytest.approx(2)
    assert "lost work unknown" in render(led)


def test_a_fault_with_no_later_progress_leaves_lost_work_unknown() -> None:
    events = [*one_fault()[:6], ev(33, "job_step_given_up", cause="hardware")]
    led = compute(7, events)
    assert not led.lost_work_known and led.restarts[0].lost_s is None and led.ended


def test_records_without_a_time_or_of_another_shape_are_skipped() -> None:
    events: list[dict[str, Any]] = [{"event": "old"}, {"time": "x", "event": "attempt_started"}, *one_fault()]
    assert compute(7, events).wall_s == pytest.approx(71)
    assert compute(7, []).attempts == 0


def test_a_running_job_is_closed_at_now() -> None:
    led = compute(7, one_fault()[:2], now=T0 + 20)
    assert led.wall_s == pytest.approx(20) and not led.ended


def test_a_job_killed_before_its_last_attempt_ended_still_resolves_the_fault_from_attempt_progress() -> None:
    """scancel past KillWait: no attempt_ended for attempt 2, only its attempt_progress record; the job's end
    comes from Slurm (`now`)."""
    events = [e for e in one_fault() if e["event"] not in ("attempt_ended", "job_step_succeeded") or e["attempt"] == 1]
    events.append(ev(45.5, "attempt_progress", attempt=2, first_step=11, first_progress_at=T0 + 45))
    led = compute(7, events, now=T0 + 71)
    assert led.restarts[0].lost_s == pytest.approx(11) and led.lost_work_known
    assert led.wall_s == pytest.approx(71) and led.productive_s == pytest.approx(10 + 27)


def reported(restore_s: float, checkpoint_s: float) -> dict[str, Any]:
    """What an attempt's `attempt_ended` says of blocked time when its ranks' hpresilience.torch heartbeats
    reported it: real heartbeat lines (rank 1 blocked longer than rank 0) through the wrapper's progress stream."""
    import os

    from hpresilience.autoresume.progress import ProgressStream
    from hpresilience.goodput.ledgerfile import attempt_record
    from hpresilience.torch.heartbeat import JOB_ENV, Heartbeat

    stream = ProgressStream()
    stream.reset(["n1", "n2"])
    for rank, extra in ((0, 0.5), (1, 0.0)):
        r, w = os.pipe()
        hb = Heartbeat(env={JOB_ENV: "7", "HPR_HEARTBEAT_EVERY_S": "0", "RANK": str(rank)}, fd=w)
        hb._installed = True
        hb.blocked("restore", restore_s - extra)
        hb.beat(11)
        hb.blocked("checkpoint", checkpoint_s / 2 - extra)
        hb.beat(12)
        hb.blocked("checkpoint", checkpoint_s / 2)
        os.close(w)
        with os.fdopen(r) as f:
            stream.feed_lines([f"{rank}: {line}" for line in f.read().splitlines()])
    rec = attempt_record(stream, 1, 0.0, 0)
    return {"checkpoint_s": rec["checkpoint_s"], "restore_s": rec["restore_s"]}


def test_blocked_save_and_restore_reported_by_hpresilience_torch_are_their_own_categories() -> None:
    """Issue 26: restore (3 s, before attempt 2's first step) comes out of reinit, saves (2 s in attempt 1's kept
    steps, 4 s in attempt 2's) out of productive time; the sum is still the wall time."""
    events = one_fault()
    for e in events:
        if e["event"] == "attempt_ended":
            e.update(reported(0.0, 2.0) if e["attempt"] == 1 else reported(3.0, 4.0))
    led = compute(7, events)
    b = led.badput_s
    assert b["restore"] == pytest.approx(3) and b["checkpoint"] == pytest.approx(6)
    assert b["reinit"] == pytest.approx(15) and led.productive_s == pytest.approx(30)
    assert b["lost_work"] == pytest.approx(11)
    assert led.productive_s + sum(b.values()) == pytest.approx(led.wall_s)
    (r,) = led.restarts
    assert r.by_category["restore"] == pytest.approx(3) and r.by_category["reinit"] == pytest.approx(6)


def test_the_printed_goodput_reads_as_the_ledger_file_stores_it() -> None:
    """The job's output and `<job>.ledger.json` say the same figure: 31.3496 % is stored as 0.3135 and must not
    print as 31.3 %."""
    ledger = Ledger(1, attempts=1, ended=True)
    ledger.start, ledger.end, ledger.productive_s = 0.0, 100.0, 31.3496
    stored = json.loads(json.dumps(ledger.to_dict()))["goodput"]
    assert f"goodput {stored * 100:.1f} %" in render(ledger)
    assert "goodput 31.4 %" in render(ledger)
