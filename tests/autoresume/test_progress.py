"""The progress stream: counters from output lines per task, heartbeats, and the output filter."""

from __future__ import annotations

import io
import os

import pytest

from hpresilience.autoresume.progress import OutputFilter, ProgressStream, output_counter, parse_heartbeat
from hpresilience.torch.heartbeat import PREFIX, Heartbeat


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("step 12", 12),
        ("step=12 loss=0.3", 12),
        ("Step 12 | loss 1.2", 12),
        ("iteration 12/1000 | lr 3e-4", 12),
        ("global_step: 12", 12),
        ("train:  12/1000 [00:03<04:10,  3.9it/s]", 12),
        ("[Epoch 0 Batch 7] step: 12", 12),
    ],
)
def test_each_documented_format_yields_its_counter(line: str, value: int) -> None:
    found = output_counter(line)
    assert found is not None and found[1] == value


@pytest.mark.parametrize("line", ["total steps: 1000", "stepping into the loop", "loss 0.3", ""])
def test_lines_without_a_counter_are_not_progress(line: str) -> None:
    assert output_counter(line) is None


def test_hf_trainer_dicts_count_as_one_step_each() -> None:
    clock = Clock()
    s = ProgressStream(clock)
    s.reset(["n1"])
    for _ in range(3):
        s.feed_lines(["0: {'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.01}"])
        clock.t += 2
    assert s.progress_events() == 3 and s.tasks()[0].last_step == 3


def test_a_changed_counter_of_the_same_task_is_progress_a_repeated_one_is_not_and_labels_name_the_node() -> None:
    clock = Clock()
    s = ProgressStream(clock)
    s.reset(["n1", "n1", "n2", "n2"])  # two tasks per node
    s.feed_lines(["0: step=5", "2: step=5"])
    clock.t += 1
    s.feed_lines(["0: step=5", "2: step 5 done", "0: checkpoint saved"])  # repeated, repeated, no counter
    assert s.last_progress() == 100.0 and s.progress_events() == 2
    clock.t += 1
    s.feed_lines(["2: step=6"])
    assert s.last_progress() == 102.0
    assert s.tasks()[2].node == "n2" and s.tasks()[0].node == "n1"
    assert s.median_interval() == 2.0  # task 2's own interval, not the one between tasks
    clock.t += 1
    s.feed_lines(["0: epoch 2 step 1"])  # a per-epoch counter starting again is a new phase, not silence
    assert s.last_progress() == 103.0


def test_heartbeats_round_trip_from_the_training_side_and_give_work_time_samples() -> None:
    r, w = os.pipe()
    clock = Clock()
    hb = Heartbeat(
        {"HPR_AUTORESUME_JOB": "7", "RANK": "3", "SLURMD_NODENAME": "n9", "HPR_HEARTBEAT_EVERY_S": "5"},
        fd=w,
        clock=clock,
    )
    for step in range(1, 13):
        with hb.working():
            clock.t += 0.3
        clock.t += 0.7
        hb.beat(step)
    os.close(w)
    with open(r) as f:
        lines = f.read().splitlines()
    # Rate-limited: the first beat, then one per 5 s (steps take 1 s), not one per step.
    assert 2 <= len(lines) <= 3 and all(ln.startswith(PREFIX) for ln in lines)
    beat = parse_heartbeat(lines[1])
    assert beat is not None and beat.rank == 3 and beat.node == "n9" and beat.steps == 5
    assert beat.step_s == pytest.approx(1.0) and beat.work_s == pytest.approx(0.3)
    s = ProgressStream(clock)
    s.reset(["n9"])
    s.feed_lines(["0: " + ln for ln in lines])
    assert s.ranks()[3].node == "n9" and s.samples[-1].seconds == pytest.approx(0.3)


def test_a_non_finite_loss_and_a_replica_verdict_are_written_at_once_and_reach_the_stream() -> None:
    r, w = os.pipe()
    clock = Clock()
    hb = Heartbeat(
        {"HPR_AUTORESUME_JOB": "7", "RANK": "0", "SLURMD_NODENAME": "n1", "HPR_HEARTBEAT_EVERY_S": "60"}, w, clock
    )
    hb.beat(1, loss=2.5, grad_norm=1.0)  # the first beat is written
    clock.t += 1
    hb.beat(2, loss=2.4)  # within the period: folded
    clock.t += 1
    hb.beat(3, loss=float("nan"), grad_norm=float("inf"))  # within the period, but non-finite: written now
    hb.beat(3)  # the same step again (a save): nothing
    hb.beat(3, loss=float("nan"))  # the same step with a non-finite loss: said again at once
    hb.report(4, replica="bad", bad_rank=3, bad_node="n2 forged=1")
    os.close(w)
    with open(r) as f:
        lines = f.read().splitlines()
    assert len(lines) == 4
    s = ProgressStream(clock)
    s.reset(["n1"])
    s.feed_lines(["0: " + ln for ln in lines])
    got = [(c.step, dict(c.fields)) for c in s.checks]
    assert got == [
        (1, {"loss": "2.5", "gnorm": "1"}),
        (3, {"loss": "nan", "gnorm": "inf"}),
        (3, {"loss": "nan"}),
        (4, {"replica": "bad", "bad_rank": "3", "bad_node": "n2"}),
    ]


def test_the_heartbeat_is_silent_outside_the_wrapper() -> None:
    r, w = os.pipe()
    hb = Heartbeat({"RANK": "0"}, fd=w)
    hb.beat(1)
    hb.beat(2)
    os.close(w)
    assert os.read(r, 100) == b""


@pytest.mark.parametrize(
    "line",
    [
        f"{PREFIX} rank=x pid=1 step=1",
        f"{PREFIX} rank=1 pid=1",
        f"{PREFIX} rank=1 pid=1 step=1 step_s=nan",
        f"{PREFIX} rank=1 pid=1 step=99999999999999 ",
        f"{PREFIX} rank=1 pid=1 step=1 stack_signal=9999",
    ],
)
def test_malformed_heartbeats_are_skipped(line: str) -> None:
    assert parse_heartbeat(line) is None


def test_the_filter_removes_heartbeats_and_our_labels_even_when_split_across_reads() -> None:
    f = OutputFilter(strip_labels=True)
    chunks = [b"0: step=1\n1: [hpr-he", b"artbeat] rank=1 pid=2 step=1\n 1", b"0: progress 50%\r", b"60%\n0: x", b"yz"]
    out = b"".join(f.push(c) for c in chunks) + f.flush()
    assert out == b"step=1\nprogress 50%\r60%\nxyz"


def test_the_filter_passes_user_lines_that_only_start_like_a_heartbeat() -> None:
    f = OutputFilter(strip_labels=False)
    out = f.push(b"[hpr") + f.push(b"] user text\n") + f.push(b"[hpr-heartbeat] rank=0 pid=1 step=1\nend\n")
    assert out == b"[hpr] user text\nend\n"


def test_once_ranks_beat_output_lines_give_no_step_time_samples() -> None:
    clock = Clock()
    s = ProgressStream(clock)
    s.reset(["n1", "n2"])
    s.feed_lines(["0: step=1"])
    clock.t += 1
    s.feed_lines(["0: step=2"])
    assert [x.key for x in s.samples] == ["task0"]
    s.feed_lines([f"1: {PREFIX} rank=1 node=n2 pid=5 step=2 steps=1 step_s=1.0 work_s=0.4"])
    clock.t += 1
    s.feed_lines(["0: step=3"])
    assert [x.key for x in s.samples] == ["task0", "rank1"]


def test_the_pump_feeds_the_stream_and_the_rules_and_forwards_only_the_users_lines() -> None:
    from hpresilience.autoresume.launch.stream import Pump
    from hpresilience.autoresume.settings import LogRuleSettings
    from hpresilience.autoresume.watch.feed import RuleFeed
    from hpresilience.autoresume.watch.rules import RuleSet

    rule = LogRuleSettings.model_validate({"name": "beat", "logPattern": ".*hpr-heartbeat.*", "faultOnMatch": True})
    feed = RuleFeed(RuleSet([rule], strip_task_label=True))
    stream = ProgressStream()
    stream.reset(["n1", "n2"])
    r, w = os.pipe()
    sink = io.BytesIO()
    pump = Pump(os.fdopen(r, "rb"), sink, feed, 65536, "stdout", stream, strip_labels=True)
    pump.start()
    os.write(w, b"0: step=3\n1: " + PREFIX.encode() + b" rank=1 node=n2 pid=9 step=3 stack_signal=37\n1: bye\n")
    os.close(w)
    pump.join(5)
    assert sink.getvalue() == b"step=3\nbye\n"
    assert stream.tasks()[0].node == "n1" and stream.ranks()[1].stack_signal == 37
    assert feed.tick() == []  # the rules never saw the heartbeat line


@pytest.mark.parametrize(
    "line",
    [
        "slurmstepd-n1: error: *** STEP 34017002.0 ON n1 CANCELLED AT 2026-11-25T17:45:50 ***",
        "slurmstepd: error: *** STEP 34017002.0 ON n1 CANCELLED AT 2026-11-25T17:45:50 ***",
        "srun: Job step 34017002.0 aborted before step completely launched.",
        "0: slurmstepd-n1: error: *** STEP 34017002.0 ON n1 CANCELLED AT 2026-11-25T17:45:50 ***",
    ],
)
def test_slurms_own_lines_about_the_step_are_not_its_progress(line: str) -> None:
    """A cancelled step's `STEP <job>.<step>` line once counted as step 34017002 (the goodput ledger's step
    range, and a hang clock reset by Slurm's own words)."""
    stream = ProgressStream(clock=lambda: 1.0)
    stream.reset(["n1"])
    stream.feed_lines(["0: step=3", line])
    assert stream.steps_seen() == (3, 3) and stream.progress_events() == 1
