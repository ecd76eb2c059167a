"""The losses of the steps a relaunched job redoes, compared with those of the attempt before (watch/replay.py)."""

from __future__ import annotations

from hpresilience.autoresume.watch.feed import RuleFeed
from hpresilience.autoresume.watch.replay import LossReplay
from hpresilience.autoresume.watch.rules import RuleSet


def test_replayed_steps_with_the_same_loss_match_and_a_different_one_is_reported() -> None:
    r = LossReplay(steps=3, tolerance=1e-3)
    for s, loss in ((9, 2.5), (10, 2.4), (11, 2.3), (12, 2.2)):
        r.line(0, f"step={s} loss={loss}")
    assert r.new_attempt().compared == []  # nothing to compare in the first attempt
    for s, loss in ((11, 2.3), (12, 2.9), (13, 2.1)):  # resumed from step 10
        r.line(0, f"step={s} loss={loss}")
    got = r.new_attempt()
    assert [(s, b, n) for _, s, b, n in got.compared] == [(11, 2.3, 2.3), (12, 2.2, 2.9)]
    assert [(s, b, n) for _, s, b, n in got.mismatched] == [(12, 2.2, 2.9)]


def test_only_the_first_steps_are_compared_and_within_tolerance_is_a_match() -> None:
    r = LossReplay(steps=2, tolerance=1e-2)
    for s in range(1, 10):
        r.line(0, f"step {s} | loss: {1.0 + s}")
    r.new_attempt()
    for s in range(5, 10):
        r.line(0, f"step {s} | loss: {1.0 + s + 0.001}")
    got = r.new_attempt()
    assert len(got.compared) == 2 and got.mismatched == []


def test_lines_without_a_step_or_a_finite_loss_and_a_disabled_replay_are_ignored() -> None:
    r = LossReplay(steps=5)
    r.line(0, "step=3 loss=2.0")
    r.new_attempt()
    for body in ("loss=2.0", "step=3 loss=nan", "step=3 val_loss_curve"):
        r.line(0, body)
    assert r.new_attempt().compared == []
    off = LossReplay(steps=0)
    off.line(0, "step=3 loss=2.0")
    assert off.now == {}


def test_the_feed_hands_each_tasks_stdout_lines_to_the_replay() -> None:
    r = LossReplay(steps=5)
    feed = RuleFeed(RuleSet([]), replay=r)
    feed.feed("0: step=4 loss=1.5\n1: step=4 loss=1.6\n", "stdout")
    feed.feed("0: step=4 loss=9.9\n", "stderr")  # not a training line of stdout
    assert r.now == {(0, 4): 1.5, (1, 4): 1.6}
