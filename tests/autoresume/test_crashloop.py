"""Crash loops (decide/crashloop.py): the signature of a failed attempt, the bound, the suspects, the exit codes
users already emit, and the records' way through the state file and the goodput ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hpresilience.autoresume.decide.classify import Cause, Diagnosis
from hpresilience.autoresume.decide.crashloop import (
    Crash,
    CrashHistory,
    CrashWatch,
    elsewhere,
    first_failed_task,
    normalize,
    signature,
)
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.autoresume.state import WrapperState, WrapperStateStore
from hpresilience.autoresume.watch.feed import RuleFeed
from hpresilience.autoresume.watch.rules import RuleSet
from hpresilience.goodput.ledger import compute

TRACE = [
    "Traceback (most recent call last):",
    '  File "/home/u/train.py", line 88, in <module>',
    "RuntimeError: bad batch at step 40 on n2 (pid 31337, tensor at 0x7f3a9c001200)",
]


def crash(attempt: int, step: int | None, sig: str = "s1", nodes: tuple[str, ...] = ("n1", "n2"), **kw: Any) -> Crash:
    return Crash(attempt, step, kw.pop("exit_code", 1), sig, nodes, **kw)


def history(bound: int = 3, mark_after: int = 3) -> CrashHistory:
    return CrashHistory(bound, mark_after, [17, 93], [16])


# -- the signature -----------------------------------------------------------------------------------------------
def test_signature_ignores_pids_addresses_labels_and_the_node_the_crash_ran_on() -> None:
    other = [
        TRACE[0],
        TRACE[1],
        "RuntimeError: bad batch at step 40 on n3 (pid 4242, tensor at 0x55d0beef0000)",
    ]
    labelled = [f"1: {ln}" for ln in other]
    assert signature(1, TRACE, ["n1", "n2"]) == signature(1, labelled, ["n1", "n3"])


def test_signature_differs_with_the_exit_code_and_with_the_error() -> None:
    assert signature(1, TRACE)[0] != signature(139, TRACE)[0]
    assert signature(1, TRACE)[0] != signature(1, [*TRACE[:2], "ValueError: shapes do not match"])[0]


def test_node_names_are_replaced_longest_first() -> None:
    assert normalize("lost n10 and n1", ["n1", "n10"]) == "lost <node> and <node>"


def test_first_failed_task_is_read_from_sruns_first_task_line() -> None:
    lines = ["srun: error: n2: task 1: Exited with exit code 1", "srun: error: n1: tasks 0,2-3: Terminated"]
    assert first_failed_task(lines) == ("n2", 1)
    assert first_failed_task(["srun: error: Timed out"]) is None


# -- the bound -------------------------------------------------------------------------------------------------
def test_the_same_crash_at_the_same_step_stops_at_the_bound_and_not_before() -> None:
    h = history(bound=3)
    assert not h.add(crash(1, 39)).loop
    j2 = h.add(crash(2, 39, nodes=("n3", "n4")))
    assert (j2.repeats, j2.loop) == (2, False)
    j3 = h.add(crash(3, 39))
    assert (j3.repeats, j3.loop, j3.nodes_differ) == (3, True, True)


def test_a_different_step_or_error_or_a_hardware_fault_starts_the_count_again() -> None:
    h = history(bound=2)
    h.add(crash(1, 39))
    assert not h.add(crash(2, 45)).loop  # progressed: another step
    assert not h.add(crash(3, 45, sig="s2")).loop  # another error
    h.add(crash(4, 45, sig="s2", hardware=True))
    assert not h.add(crash(5, 45, sig="s2")).loop
    assert h.add(crash(6, 45, sig="s2")).loop


def test_bound_zero_never_stops() -> None:
    h = history(bound=0)
    assert not any(h.add(crash(i, 39)).loop for i in range(1, 10))


def test_a_repeat_on_the_same_nodes_asks_to_move_before_the_bound() -> None:
    h = history(bound=3)
    h.add(crash(1, 39))
    j = h.add(crash(2, 39))
    assert j.move and not j.nodes_differ


def test_elsewhere_swaps_as_many_nodes_as_the_allocation_has_free() -> None:
    assert elsewhere(["n1", "n2", "n3"], ["n1", "n2"]) == ["n3", "n2"]
    assert elsewhere(["n1", "n2", "n3", "n4"], ["n1", "n2"]) == ["n3", "n4"]
    assert elsewhere(["n1", "n2", "n3"], ["n1", "n2"], unhealthy=["n3"]) == ["n1", "n2"]


def test_elsewhere_swaps_the_node_that_failed_first_before_the_others() -> None:
    assert elsewhere(["n1", "n2", "n3"], ["n1", "n2"], first="n2") == ["n1", "n3"]
    assert elsewhere(["n1", "n2", "n3", "n4"], ["n1", "n2"], first="n2") == ["n4", "n3"]


# -- suspects --------------------------------------------------------------------------------------------------
def test_the_same_crash_at_different_steps_with_the_same_node_failing_first_makes_it_a_suspect() -> None:
    h = history(mark_after=3)
    assert h.add(crash(1, 12, first_node="n2")).suspects == {}
    j = h.add(crash(2, 31, first_node="n2"))
    assert j.suspects == {"n2": [12, 31]} and not h.should_mark(j.suspects["n2"])
    j = h.add(crash(3, 57, first_node="n2"))
    assert h.should_mark(j.suspects["n2"])


def test_another_node_failing_first_is_no_suspect() -> None:
    h = history()
    h.add(crash(1, 12, first_node="n2"))
    assert h.add(crash(2, 31, first_node="n1")).suspects == {}


# -- exit codes users emit -------------------------------------------------------------------------------------
def test_megatron_17_and_nvrx_93_stop_and_megatron_16_asks_for_a_rerun_that_is_no_loop() -> None:
    h = history(bound=2)
    assert "result validation" in (h.add(crash(1, 5, exit_code=17)).stop_code or "")
    assert "NVRx" in (h.add(crash(2, 5, exit_code=93)).stop_code or "")
    for i in range(3, 6):
        j = h.add(crash(i, 5, exit_code=16))
        assert j.rerun_elsewhere and not j.loop and j.stop_code is None


# -- the state file --------------------------------------------------------------------------------------------
def test_records_survive_the_state_file_and_a_foreign_record_is_dropped(tmp_path: Path) -> None:
    h = history(bound=2)
    h.add(crash(1, 39, first_node="n2", tail=("RuntimeError: x",)))
    store = WrapperStateStore(tmp_path, 7)
    junk: list[Any] = [{"attempt": "x"}, "junk"]
    store.save(WrapperState(7, crashes=[*h.to_records(), *junk]))
    again = CrashHistory(2, 3, [], [], store.load().crashes)
    assert len(again.crashes) == 1 and again.add(crash(2, 39)).loop


# -- the watch as the supervisor uses it -----------------------------------------------------------------------
def watch(tmp_path: Path, state: WrapperState, **settings: Any) -> tuple[CrashWatch, RuleFeed, Reporter]:
    store = WrapperStateStore(tmp_path, 7)
    rep = Reporter(store, 7, None)
    feed = RuleFeed(RuleSet([]))
    progress = ProgressStream()
    return CrashWatch(AutoResumeSettings(**settings), state, rep, progress, feed), feed, rep


def events(tmp_path: Path) -> list[str]:
    import json

    return [json.loads(ln)["event"] for ln in (tmp_path / "7.events.jsonl").read_text().splitlines()]


def test_watch_turns_the_third_identical_crash_into_a_crash_loop_and_keeps_the_record(tmp_path: Path) -> None:
    state = WrapperState(7)
    w, feed, _ = watch(tmp_path, state, crash_loop_bound=3)
    app = Diagnosis(Cause.APPLICATION, (), "step exited 1")
    for attempt in (1, 2, 3):
        feed.reset()
        w.progress.reset()
        w.progress.feed_lines(["0: step 38", "0: step 39"])
        feed.feed("".join(f"1: {ln}\n" for ln in TRACE), "stderr")
        feed.feed("srun: error: n2: task 1: Exited with exit code 1\n", "stderr")
        c = w.crash(1, ["n1", "n2"], attempt)
        assert c.step == 39 and c.first_node == "n2" and c.tail[-1].startswith("RuntimeError")
        assert w.repeating(c) == (attempt > 1)
        d, j = w.judge(c, app)
    assert d.cause is Cause.CRASH_LOOP and j.repeats == 3 and "no node marked" in d.detail
    assert len(state.crashes) == 3
    assert events(tmp_path) == ["crash_repeated", "crash_repeated", "crash_loop_stopped"]


def test_watch_marks_a_node_that_crashed_the_same_way_at_three_steps(tmp_path: Path) -> None:
    state = WrapperState(7)
    w, _, _ = watch(tmp_path, state, crash_suspect_mark_after=3)
    marked: list[str] = []

    def mark(node: str, why: str, evidence: str) -> bool:
        marked.append(node)
        return True

    app = Diagnosis(Cause.APPLICATION)
    d = app
    for attempt, step in ((1, 12), (2, 31), (3, 57)):
        d, _ = w.judge(crash(attempt, step, first_node="n2"), app, mark)
    assert marked == ["n2"] and d.cause is Cause.HARDWARE and d.bad_nodes == ("n2",)
    assert events(tmp_path).count("crash_suspect_node") == 2


def test_feed_keeps_each_tasks_stderr_tail_apart_from_stdout_and_slurms_own_lines() -> None:
    feed = RuleFeed(RuleSet([]))
    feed.feed("0: step 3\n1: step 3\n", "stdout")
    feed.feed("1: boom\n0: other\nsrun: error: n2: task 1: Exited with exit code 1\n", "stderr")
    assert feed.error_tail(1) == ["boom"] and feed.error_tail(0) == ["other"]
    assert feed.error_tail(None) == ["other"]  # the lowest task that wrote to stderr
    feed.reset()
    feed.feed("0: step 3\n", "stdout")
    assert feed.error_tail(5) == ["step 3"]


# -- the ledger ------------------------------------------------------------------------------------------------
def test_the_ledger_says_the_job_stopped_at_the_crash_loop() -> None:
    t0 = 1_700_000_000.0
    evs: list[dict[str, Any]] = [
        {"time": t0, "event": "supervisor_started"},
        {"time": t0, "event": "attempt_started", "attempt": 1, "nodes": "n1,n2"},
        {"time": t0 + 5, "event": "fault_seen", "cause": "application", "attempt": 1},
        {"time": t0 + 6, "event": "step_relaunching"},
        {"time": t0 + 6, "event": "attempt_started", "attempt": 2, "nodes": "n1,n2"},
        {"time": t0 + 9, "event": "crash_loop_stopped", "stopped_after": 2},
        {"time": t0 + 9, "event": "fault_seen", "cause": "crash_loop", "attempt": 2},
        {"time": t0 + 9, "event": "job_step_given_up", "cause": "crash_loop"},
    ]
    led = compute(7, evs)
    assert [(r.cause, r.action) for r in led.restarts] == [("application", "relaunch"), ("crash_loop", "stop")]


def test_the_crash_step_is_the_failing_tasks_last_step_not_a_faster_ranks(tmp_path: Path) -> None:
    """srun ends the other tasks a moment after the first fails: one of them may have printed a step more."""
    w, feed, _ = watch(tmp_path, WrapperState(7))
    w.progress.feed_lines(["0: step 39", "0: step 40", "1: step 38", "1: step 39"])
    feed.feed("srun: error: n2: task 1: Exited with exit code 1\n", "stderr")
    assert w.crash(1, ["n1", "n2"], 1).step == 39
    w.progress.feed_lines(["1: RuntimeError: bad batch at step 40", "1: step=39"])  # stderr read before stdout
    assert w.crash(1, ["n1", "n2"], 1).step == 40
    feed.reset()
    assert w.crash(1, ["n1", "n2"], 1).step == 40  # no task named: the highest step seen


def test_the_crash_step_takes_the_failing_tasks_output_over_its_lagging_heartbeat(tmp_path: Path) -> None:
    w, feed, _ = watch(tmp_path, WrapperState(7))
    beat = "0: [hpr-heartbeat] rank=0 node=n1 pid=5 step=30 steps=1 step_s=0.1"
    w.progress.feed_lines([beat, "0: step=38", "0: step=39"])
    feed.feed("srun: error: n1: task 0: Exited with exit code 1\n", "stderr")
    assert w.crash(1, ["n1", "n2"], 1).step == 39


# -- settings --------------------------------------------------------------------------------------------------
def test_the_crash_loop_keys_have_their_defaults_and_a_misspelt_key_or_a_bad_code_is_named() -> None:
    s = AutoResumeSettings()
    assert (s.crash_loop_bound, s.crash_suspect_mark_after, s.stop_exit_codes, s.rerun_exit_codes) == (
        3,
        3,
        [17, 93],
        [16],
    )
    with pytest.raises(ValidationError, match="crash_loop_bnd"):
        AutoResumeSettings.model_validate({"crash_loop_bnd": 3})
    with pytest.raises(ValidationError, match=r"exit codes are 1-255, got \[0, 300\]"):
        AutoResumeSettings.model_validate({"stop_exit_codes": [0, 300]})


# -- blame across attempts -------------------------------------------------------------------------------------
def test_a_node_found_bad_by_two_failed_attempts_within_the_window_is_named_again() -> None:
    h = CrashHistory(3, 3, [], [], window_s=3600)
    assert h.add(crash(1, 10, hardware=True, blamed=("n2",), at=1000.0)).again == {}
    assert h.add(crash(2, 20, hardware=True, blamed=("n3",), at=1500.0)).again == {}
    assert h.add(crash(3, 30, hardware=True, blamed=("n2",), at=2000.0)).again == {"n2": [1, 3]}
    assert h.add(crash(4, 40, hardware=True, blamed=("n3",), at=9000.0)).again == {}  # outside the window


def test_the_programs_crashes_name_no_node_again(tmp_path: Path) -> None:
    w, _, _ = watch(tmp_path, WrapperState(7))
    app = Diagnosis(Cause.APPLICATION)
    for attempt in (1, 2, 3):
        _, j = w.judge(crash(attempt, 40, first_node="n1"), app)
        assert j.again == {}
    hw = Diagnosis(Cause.HARDWARE, ("n2",))
    w.judge(crash(4, 50), hw)
    _, j = w.judge(crash(5, 60), hw)
    assert j.again == {"n2": [4, 5]} and "node_blamed_again" in events(tmp_path)
