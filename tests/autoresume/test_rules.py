"""Log rules: HyperPod's semantics on an injectable clock, and hostile output that never hurts."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import pytest

from hpresilience.autoresume.settings import LogRuleSettings
from hpresilience.autoresume.watch.lines import LineBuffer
from hpresilience.autoresume.watch.rules import LogState, RuleSet, RuleTripped

LOSS = r".*\[Epoch 0 Batch \d+.*'training_loss_step': (\d+(\.\d+)?).*"


def rule(**kw: Any) -> LogRuleSettings:
    return LogRuleSettings.model_validate({"name": "R", **kw})


def batch(i: int, loss: float = 2.5) -> str:
    return f"2025-01-01 [INFO] [Epoch 0 Batch {i} ...] {{'training_loss_step': {loss}, 'lr': 0.1}}"


def test_hang_trips_after_recurring_frequency_without_output() -> None:
    rs = RuleSet([rule(logPattern=LOSS, expectedRecurringFrequencyInSeconds=300)], now=0)
    assert rs.feed(batch(1), 10) == []
    assert rs.tick(310) == []  # exactly 300 s since the last match: HyperPod compares with ">"
    ev = rs.tick(310.5)
    assert [(e.rule, e.state) for e in ev] == [("R", LogState.HANGING)] and ev[0].line == batch(1)
    assert ev[0].name == "LogStateHanging_R"
    assert rs.tick(400) == []  # reported once, not at every tick


def test_steady_progress_never_trips() -> None:
    rs = RuleSet([rule(logPattern=LOSS, expectedRecurringFrequencyInSeconds=300, expectedStartCutOffInSeconds=60)])
    events = [e for t in range(0, 3000, 100) for e in rs.feed(batch(t), t + 50) + rs.tick(t + 99)]
    assert events == [] and rs.states() == {"R": LogState.HEALTHY}


def test_hang_rearms_after_a_new_match() -> None:
    rs = RuleSet([rule(logPattern="step", expectedRecurringFrequencyInSeconds=10, action="log")])
    rs.feed("step 1", 0)
    assert len(rs.tick(11)) == 1
    rs.feed("step 2", 12)
    assert rs.tick(20) == [] and len(rs.tick(23)) == 1


def test_start_cutoff_counts_from_the_attempt_start() -> None:
    rs = RuleSet(
        [rule(name="JobStart", logPattern=".*Experiment configuration.*", expectedStartCutOffInSeconds=120)], now=1000
    )
    rs.feed("loading data", 1100)
    assert rs.tick(1120) == []
    ev = rs.tick(1121)
    assert ev[0].state is LogState.HANGING and ev[0].name == "LogStateHanging_JobStart"
    rs.reset(2000)  # a new attempt: the cutoff is measured afresh
    assert rs.states() == {"JobStart": LogState.WAITING} and rs.tick(2100) == []
    rs.feed("x Experiment configuration: {...}", 2110)
    assert rs.tick(5000) == [] and rs.states() == {"JobStart": LogState.HEALTHY}


def test_metric_trips_only_after_that_many_consecutive_bad_points() -> None:
    rs = RuleSet([rule(logPattern=LOSS, metricThreshold=5, operator="gt", metricEvaluationDataPoints=3)])
    assert rs.feed(batch(1, 9.0), 1) == [] and rs.feed(batch(2, 9.0), 2) == []
    assert rs.feed(batch(3, 1.0), 3) == []  # a good point breaks the run
    assert rs.feed(batch(4, 9.0), 4) == [] and rs.feed(batch(5, 7.5), 5) == []
    ev = rs.feed(batch(6, 5.5), 6)
    assert [(e.state, e.at) for e in ev] == [(LogState.SLOW, 6)] and "5.5 gt 5" in ev[0].detail


def test_metric_counts_bad_points_across_one_block_in_order() -> None:
    rs = RuleSet([rule(logPattern=LOSS, metricThreshold=5, operator="gt", metricEvaluationDataPoints=2)])
    block = "\n".join([batch(1, 9), "noise", batch(2, 1), batch(3, 9), batch(4, 9)]) + "\n"
    ev = rs.feed_text(block, 7)
    assert len(ev) == 1 and ev[0].line == batch(4, 9)


@pytest.mark.parametrize(
    ("op", "bad", "good"),
    [
        ("gt", 81, 80),
        ("gteq", 80, 79.9),
        ("lt", 79, 80),
        ("lteq", 80, 80.1),
        ("eq", 80, 80.5),
    ],
)
def test_each_operator_marks_the_bad_side(op: str, bad: float, good: float) -> None:
    rs = RuleSet([rule(logPattern=r".*'samples/sec': (\d+(\.\d+)?)", metricThreshold=80, operator=op)])
    assert rs.feed(f"'samples/sec': {good}", 1) == []
    assert [e.state for e in rs.feed(f"'samples/sec': {bad}", 2)] == [LogState.SLOW]


def test_uncapturable_metric_is_skipped_not_fatal() -> None:
    rs = RuleSet([rule(logPattern=r".*loss: (\S+)", metricThreshold=1, operator="gt", metricEvaluationDataPoints=2)])
    assert rs.feed("loss: nanx", 1) == [] and rs.feed("loss: 5", 2) == []
    assert rs.feed("loss: oops", 3) == []  # skipped: neither counts nor breaks the run
    assert [e.state for e in rs.feed("loss: 7", 4)] == [LogState.SLOW]


def test_stop_pattern_deactivates_the_rule_for_the_attempt() -> None:
    rs = RuleSet(
        [
            rule(
                logPattern=LOSS,
                stopPattern=".*Training complete.*",
                expectedRecurringFrequencyInSeconds=10,
                metricThreshold=5,
                operator="gt",
            )
        ]
    )
    rs.feed(batch(1, 1), 0)
    # The stop line itself matches logPattern too: recorded, but its metric is not evaluated (HyperPod order).
    assert rs.feed_text(batch(2, 1) + " Training complete\n" + batch(3, 99) + "\n", 5) == []
    assert rs.states() == {"R": LogState.STOPPED} and rs.tick(1000) == []
    rs.reset(2000)
    assert [e.state for e in rs.feed(batch(4, 99), 2001)] == [LogState.SLOW]


def test_lines_before_the_stop_line_in_a_block_still_count() -> None:
    rs = RuleSet([rule(logPattern=r"loss (\d+)", stopPattern="done", metricThreshold=5, operator="gt")])
    assert [e.state for e in rs.feed_text("loss 9\ndone\nloss 9\n", 1)] == [LogState.SLOW]


def test_fault_on_match_trips_at_once() -> None:
    rs = RuleSet([rule(logPattern=".*NCCL error.*", faultOnMatch=True)])
    assert rs.feed("all good", 1) == []
    ev = rs.feed("rank 3: NCCL error: unhandled system error", 2)
    assert [(e.state, e.action) for e in ev] == [(LogState.FAULTED, "restart")]


def test_patterns_are_anchored_at_line_start_like_re_match() -> None:
    rs = RuleSet([rule(logPattern="Loss", faultOnMatch=True), rule(name="S", logPattern="^x$", faultOnMatch=True)])
    assert rs.feed_text("step 1 Loss 3\nab\nx\n", 1) == [
        RuleTripped("S", LogState.FAULTED, "logPattern matched (faultOnMatch)", 1, "restart", "x")
    ]
    assert [e.rule for e in rs.feed("Loss 3", 2)] == ["R"]


def test_srun_task_labels_can_be_stripped() -> None:
    rules = [rule(logPattern="Loss", faultOnMatch=True)]
    assert RuleSet(rules).feed_text(" 3: Loss 1\n", 1) == []
    assert len(RuleSet(rules, strip_task_label=True).feed_text(" 3: Loss 1\n12: Loss 2\n", 1)) == 2


# --- the prefilter must never change a verdict: compare with a plain per-line HyperPod evaluator -------------


def reference(rules: list[LogRuleSettings], lines: list[tuple[str, float]]) -> list[tuple[str, str, float]]:
    """HyperPod's per-line algorithm, written out naively: every regex on every line."""
    ops = {
        "gt": lambda a, b: a > b,
        "gteq": lambda a, b: a >= b,
        "lt": lambda a, b: a < b,
        "lteq": lambda a, b: a <= b,
        "eq": lambda a, b: a == b,
    }
    out = []
    for r in rules:
        active, count = True, 0
        for line, t in lines:
            if not active:
                break
            m = re.match(r.log_pattern, line)
            if m and r.fault_on_match:
                out.append((r.name, "FAULTED", t))
                continue
            if r.stop_pattern and re.match(r.stop_pattern, line):
                active = False
                continue
            if m and r.operator is not None and r.metric_threshold is not None:
                try:
                    v = float(m.group(1))
                except (TypeError, ValueError):
                    continue
                if ops[r.operator](v, r.metric_threshold):
                    count += 1
                    if count >= r.data_points:
                        out.append((r.name, "SLOW", t))
                        count = 0
                else:
                    count = 0
    return sorted(out)


@pytest.mark.parametrize("seed", range(6))
def test_prefiltered_engine_agrees_with_naive_evaluation(seed: int) -> None:
    rnd = random.Random(seed)
    rules = [
        rule(
            name="loss",
            logPattern=LOSS,
            metricThreshold=3,
            operator="gt",
            metricEvaluationDataPoints=2,
            stopPattern=".*Training complete.*",
        ),
        rule(name="nolit", logPattern=r"(\d+) it/s", metricThreshold=50, operator="lt"),
        rule(name="anch", logPattern=r"^\w+ (\d+) tflops", metricThreshold=100, operator="lteq"),
        rule(name="fault", logPattern=".*(NCCL|CUDA) error.*", faultOnMatch=True),
        rule(name="ci", logPattern="(?i).*WARNING (\\d+).*", metricThreshold=5, operator="eq"),
    ]
    pieces: list[Callable[[], str]] = [
        lambda: batch(rnd.randint(0, 99), rnd.choice([1.0, 4.0, 7.5])),
        lambda: f"{rnd.randint(0, 99)} it/s",
        lambda: f"gpu {rnd.randint(50, 150)} tflops",
        lambda: f"x gpu {rnd.randint(50, 150)} tflops",
        lambda: rnd.choice(["NCCL error", "a CUDA error b", "no error"]),
        lambda: "warning 5 here",
        lambda: "Training complete" if rnd.random() < 0.05 else "noise 'training_loss_step': x",
        lambda: "",
        lambda: "\x00\ufffd binary",
    ]
    lines = [(rnd.choice(pieces)(), float(i // 7)) for i in range(400)]
    rs = RuleSet(rules)
    got: list[tuple[str, str, float]] = []
    i = 0
    while i < len(lines):  # blocks of random size, all lines of a block read at the block's time
        j = min(len(lines), i + rnd.randint(1, 12))
        block = lines[i:j]
        t = block[-1][1]
        got += [(e.rule, e.state.value, e.at) for e in rs.feed_text("".join(x + "\n" for x, _ in block), t)]
        i = j
    expected = reference(rules, lines)
    # Each block is stamped with its last line's time; compare the events per rule and state, in count.
    assert sorted((r, s) for r, s, _ in got) == sorted((r, s) for r, s, _ in expected)
    assert expected  # the generated log does exercise the rules


# --- hostile output ---------------------------------------------------------------------------------------------


def test_line_buffer_joins_partial_lines_and_splits_carriage_returns() -> None:
    lb = LineBuffer()
    assert lb.push(b"Batch 1 lo") == ""
    assert lb.push(b"ss 2\nBatch 2") == "Batch 1 loss 2\n"
    assert lb.push(b"\r50%\r100%\r\nend") == "Batch 2\n50%\n100%\n"
    assert lb.flush() == "end\n" and lb.flush() == ""


def test_line_buffer_replaces_invalid_utf8_and_keeps_split_characters_whole() -> None:
    lb = LineBuffer()
    euro = "€".encode()
    assert lb.push(b"\xff\xfe bad " + euro[:1]) == ""
    assert lb.push(euro[1:] + b"\n") == "\ufffd\ufffd bad €\n"


def test_huge_lines_are_cut_and_their_rest_dropped() -> None:
    lb = LineBuffer(max_line_bytes=1000)
    assert lb.push(b"a" * 5000) == ""
    assert lb.push(b"b" * 5000) == ""  # still the same over-long line: dropped, memory stays bounded
    out = lb.push(b"c" * 10 + b"\nnext\n" + b"d" * 3000 + b"\nlast\n")
    assert out == "a" * 1000 + "\nnext\n" + "d" * 1000 + "\nlast\n"


def test_rule_set_survives_hostile_input() -> None:
    rs = RuleSet(
        [rule(logPattern=LOSS, metricThreshold=1, operator="gt", expectedRecurringFrequencyInSeconds=5)],
        max_line_chars=4096,
    )
    lb = LineBuffer(max_line_bytes=4096)
    rnd = random.Random(1)
    for k in range(200):
        chunk = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 3000)))
        rs.feed_text(lb.push(chunk), k * 0.01)
    rs.feed("x" * 10_000_000 + "'training_loss_step': 5", 3)  # cut before matching: no match, no stall
    assert rs.states()["R"] is LogState.WAITING
    assert [e.state for e in rs.feed(batch(1, 9), 4)] == [LogState.SLOW]


@pytest.mark.parametrize("key", ["logPattern", "stopPattern"])
def test_catastrophic_backtracking_pattern_decides_a_hostile_line(key: str) -> None:
    """Issue 14 item 6: `(a+)+$` on 40 characters took Python's `re` days, holding the GIL (the wrapper froze).
    On RE2 the line is decided in linear time; under `re` this test would run into pytest's timeout."""
    evil = "(a+)+$"
    kw: dict[str, Any] = (
        {"logPattern": evil, "faultOnMatch": True}
        if key == "logPattern"
        else {"logPattern": "never", "stopPattern": evil, "expectedStartCutOffInSeconds": 60}
    )
    rs = RuleSet([rule(**kw)])
    hostile = "a" * 40 + "!"
    assert rs.feed(hostile * 1, 1.0) == [] and rs.feed_text((hostile + "\n") * 100, 2.0) == []
    if key == "logPattern":
        assert [e.state for e in rs.feed("a" * 40, 3.0)] == [LogState.FAULTED]
    else:
        rs.feed("a" * 40, 3.0)
        assert rs.states() == {"R": LogState.STOPPED}


def test_unicode_and_optional_groups_match_as_re_would() -> None:
    """RE2 works on UTF-8 bytes: groups after non-ASCII text are still the right characters, and a missed
    optional group is counted as a bad metric, not a crash."""
    rs = RuleSet([rule(logPattern=r".*débit (\d+)(x)?.*", operator="lt", metricThreshold=5)])
    ev = rs.feed("été: débit 3 ✓", 1.0)
    assert [e.state for e in ev] == [LogState.SLOW] and "metric 3 lt 5" in ev[0].detail
    rs2 = RuleSet([rule(logPattern=r".*loss(?: (\d+))?", operator="gt", metricThreshold=5)])
    assert rs2.feed("loss", 1.0) == [] and rs2.states()["R"] is LogState.HEALTHY
