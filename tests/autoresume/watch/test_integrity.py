"""The integrity watch: robust z-scores that a healthy noisy loss curve never trips, losses read from output
lines, and the verdicts for a replica disagreement (relaunch, then mark Action:Replace), a NaN (rollback with a
skip window, within a budget) and a stop."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from hpresilience.autoresume.decide.classify import Cause
from hpresilience.autoresume.decide.ending import INTEGRITY_CAUSES
from hpresilience.autoresume.decide.marking import mark_nodes
from hpresilience.autoresume.decide.policy import FailureKind, PolicyChoice, RestartPolicy
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.settings import AutoResumeSettings, RunPolicySettings
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.autoresume.watch.base import Act, StepEnvSource
from hpresilience.autoresume.watch.integrity import ROLLBACK_RULE, STOP_RULE, Integrity
from hpresilience.autoresume.watch.losses import SpikeWatch, loss_in_line, robust_z
from hpresilience.reasons import Action
from hpresilience.slurm.client import SlurmClient

JOB = 7


class Step:
    attempt = 1
    nodes = ("n1", "n2")
    requested = 2


class Marks(SlurmClient):
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str, str]] = []

    def set_node_state(self, names: Any, action: Any, reason: str = "") -> None:
        self.calls.append((list(names), str(action), reason))


def healthy_curve(seed: int, n: int = 3000) -> list[float]:
    """A decaying loss with 15 % multiplicative noise and a bump every few hundred steps (a new data shard)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base = 0.5 + 4.0 * math.exp(-i / 400)
        bump = 1.3 if i % 300 < 5 else 1.0
        out.append(base * bump * math.exp(rng.gauss(0, 0.15)))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_noisy_loss_curve_never_trips_the_spike_watch_at_the_defaults(seed: int) -> None:
    w = AutoResumeSettings()
    watch = SpikeWatch(w.loss_spike_window, w.loss_spike_z, w.loss_spike_min_samples)
    assert [i for i, v in enumerate(healthy_curve(seed)) if watch.add(v) is not None] == []


def test_a_loss_five_times_the_window_is_a_spike_and_stays_out_of_the_window() -> None:
    watch = SpikeWatch(50, 10.0, 20)
    for v in healthy_curve(1, 100):
        assert watch.add(v) is None
    before = list(watch.values)
    z = watch.add(5 * before[-1])
    assert z is not None and z > 10
    assert list(watch.values) == before


def test_robust_z_ignores_the_outliers_of_its_window() -> None:
    window = [1.0, 1.1, 0.9, 1.0, 100.0, 1.05, 0.95]
    assert robust_z(window, 1.2) < 4
    assert robust_z(window, 3.0) > 10


@pytest.mark.parametrize(
    ("line", "loss"),
    [
        ("step=12 loss=0.5312", 0.5312),
        ("{'loss': 1.25e-1, 'grad_norm': 3.0, 'epoch': 0.1}", 0.125),
        ('{"loss": NaN}', math.nan),
        ("iter 5 | loss: inf | lr 1e-4", math.inf),
        ("val_loss=0.3 loss_scale=65536", None),
        ("no loss here", None),
    ],
)
def test_the_loss_of_an_output_line_is_read_and_other_metrics_are_not(line: str, loss: float | None) -> None:
    got = loss_in_line(line)
    if loss is None or not math.isnan(loss):
        assert got == loss
    else:
        assert got is not None and math.isnan(got)


def _watch(tmp_path: Path, **settings: Any) -> tuple[Integrity, ProgressStream, Marks]:
    progress, client = ProgressStream(), Marks()
    reporter = Reporter(WrapperStateStore(tmp_path, JOB), JOB, None)
    watch = Integrity(AutoResumeSettings(**settings), progress, reporter)
    progress.reset(["n1", "n1", "n2", "n2"])
    watch.start(Step())
    return watch, progress, client


def _beat(progress: ProgressStream, step: int, fields: str, rank: int = 0, node: str = "n1") -> None:
    progress.feed_lines([f"{rank}: [hpr-heartbeat] rank={rank} node={node} pid=9 step={step} {fields}"])


def test_a_replica_named_once_relaunches_from_the_last_passed_check_and_twice_marks_its_node(tmp_path: Path) -> None:
    watch, progress, client = _watch(tmp_path)
    assert isinstance(watch, StepEnvSource)
    _beat(progress, 10, "replica=ok")
    _beat(progress, 20, "replica=bad bad_rank=3 bad_node=n2")
    first = watch.poll(1.0, Step())
    assert first is not None and first.act is Act.STOP_NOW and first.nodes == ()
    assert first.trip is not None and first.trip.rule == ROLLBACK_RULE and "rank 3 on n2" in first.why
    assert watch.step_env() == {"HPR_RESTORE_MAX_STEP": "10"}
    assert client.calls == []
    progress.reset(["n1", "n1", "n2", "n2"])
    watch.start(Step())
    _beat(progress, 20, "replica=bad bad_rank=3 bad_node=n2")
    second = watch.poll(2.0, Step())
    assert second is not None and second.nodes == ("n2",)
    assert client.calls == []  # a detector marks nothing itself: its verdict asks, decide/marking.py marks
    assert second.mark is not None and second.mark.action is Action.REPLACE and "rank 3 on n2" in second.mark.why
    reporter = Reporter(WrapperStateStore(tmp_path, JOB), JOB, None)
    assert mark_nodes(client, reporter, JOB, second.nodes, second.mark) == ["n2"]
    [(nodes, action, reason)] = client.calls
    assert nodes == ["n2"] and action == "fail" and reason.startswith("Action:Replace [hpr-autoresume job 7]")
    assert "rank 3 on n2" in reason and "evidence=" in reason


def test_two_replicas_that_differ_roll_back_without_naming_or_marking_a_node(tmp_path: Path) -> None:
    watch, progress, client = _watch(tmp_path, replica_mark_after=1)
    _beat(progress, 10, "replica=ok")
    _beat(progress, 20, "replica=undecided bad_rank=0 bad_node=n1")
    v = watch.poll(1.0, Step())
    assert v is not None and v.act is Act.STOP_NOW and v.nodes == () and client.calls == []
    assert watch.named == {"n1": 0} and watch.step_env() == {"HPR_RESTORE_MAX_STEP": "10"}


def test_a_replica_report_naming_a_node_outside_the_step_is_ignored(tmp_path: Path) -> None:
    watch, progress, client = _watch(tmp_path, replica_mark_after=1)
    _beat(progress, 20, "replica=bad bad_rank=3 bad_node=login1")
    assert watch.poll(1.0, Step()) is None and client.calls == []


def test_a_nan_loss_rolls_back_before_its_step_skips_the_window_and_then_the_budget_stops(tmp_path: Path) -> None:
    watch, progress, _ = _watch(tmp_path, loss_policy="rollback", loss_skip_steps=2, loss_rollbacks=1)
    for s in range(1, 23):
        _beat(progress, s, f"loss={1.0 / s:.4f}")
    _beat(progress, 23, "loss=nan")
    v = watch.poll(1.0, Step())
    assert v is not None and v.trip is not None and v.trip.rule == ROLLBACK_RULE and "loss is nan at step 23" in v.why
    assert watch.step_env() == {"HPR_RESTORE_MAX_STEP": "22", "HPR_SKIP_STEPS": "22-23"}
    progress.reset(["n1", "n1", "n2", "n2"])
    watch.start(Step())
    _beat(progress, 21, "loss=0.04")
    assert watch.poll(2.0, Step()) is None
    _beat(progress, 30, "loss=0.03")  # past the failed attempt's last step: its checkpoints are saved again
    assert watch.poll(3.0, Step()) is None
    assert watch.step_env() == {"HPR_SKIP_STEPS": "22-23"}
    _beat(progress, 31, "loss=inf")
    stop = watch.poll(4.0, Step())
    assert stop is not None and stop.trip is not None and stop.trip.rule == STOP_RULE
    assert stop.why == "training stopped: loss is inf at step 31 (rank0 on n1); 1 rollbacks spent"


def test_with_loss_policy_stop_a_nan_in_an_output_line_ends_the_job_with_a_one_line_reason(tmp_path: Path) -> None:
    watch, progress, _ = _watch(tmp_path)  # the default policy is stop
    progress.feed_lines(["0: step=5 loss=0.4", "2: step=6 loss=nan"])
    v = watch.poll(1.0, Step())
    assert v is not None and v.act is Act.STOP_NOW and v.trip is not None and v.trip.rule == STOP_RULE
    assert v.why == "training stopped: loss is nan at step 6 (task2 on n2); loss_policy stop"
    assert "\n" not in v.why


def test_a_loss_that_is_no_number_is_ignored(tmp_path: Path) -> None:
    watch, progress, _ = _watch(tmp_path)
    _beat(progress, 3, "loss=abc gnorm=0x1p3 replica=maybe")
    assert watch.poll(1.0, Step()) is None


def test_loss_policy_off_ignores_a_nan(tmp_path: Path) -> None:
    watch, progress, _ = _watch(tmp_path, loss_policy="off")
    _beat(progress, 3, "loss=nan gnorm=inf")
    assert watch.poll(1.0, Step()) is None


def test_a_stop_ends_the_job_and_a_rollback_is_a_restart_within_the_budget() -> None:
    assert INTEGRITY_CAUSES[STOP_RULE] is Cause.DIVERGED and INTEGRITY_CAUSES[ROLLBACK_RULE] is Cause.INTEGRITY
    policy = RestartPolicy(RunPolicySettings())
    assert policy.decide(FailureKind.DIVERGED, 137).choice is PolicyChoice.GIVE_UP
    assert policy.decide(FailureKind.RULE_TRIPPED, 137).choice is PolicyChoice.RESTART_STEP


def test_unknown_integrity_keys_are_named() -> None:
    with pytest.raises(ValueError, match="loss_polcy"):
        AutoResumeSettings.model_validate({"loss_polcy": "stop"})
    with pytest.raises(ValueError, match="loss_policy"):
        AutoResumeSettings.model_validate({"loss_policy": "ignore"})


def _requeued(tmp_path: Path, **settings: Any) -> tuple[Integrity, ProgressStream, Reporter]:
    """A wrapper started again by a requeue: the state file read back, the watch built on it."""
    store = WrapperStateStore(tmp_path, JOB)
    state = store.load()
    progress, reporter = ProgressStream(), Reporter(store, JOB, None)
    watch = Integrity(AutoResumeSettings(**settings), progress, reporter, state)
    progress.reset(["n1", "n1", "n2", "n2"])
    watch.start(Step())
    return watch, progress, reporter


def test_replica_namings_the_restore_bound_skips_and_rollbacks_survive_a_requeue(tmp_path: Path) -> None:
    store = WrapperStateStore(tmp_path, JOB)
    state = store.load()
    progress = ProgressStream()
    settings: dict[str, Any] = {"loss_policy": "rollback", "loss_rollbacks": 1}
    watch = Integrity(AutoResumeSettings(**settings), progress, Reporter(store, JOB, None), state)
    progress.reset(["n1", "n1", "n2", "n2"])
    watch.start(Step())
    _beat(progress, 10, "replica=ok")
    _beat(progress, 20, "replica=bad bad_rank=3 bad_node=n2")
    assert watch.poll(1.0, Step()) is not None
    progress.reset(["n1", "n1", "n2", "n2"])
    watch.start(Step())
    _beat(progress, 8, "loss=nan")
    assert watch.poll(2.0, Step()) is not None
    store.save(state)  # what the supervisor does before each attempt and before a requeue
    again, progress, _ = _requeued(tmp_path, **settings)
    assert again.named == {"n2": 1} and again.last_ok == 10 and again.rollbacks == 1
    assert again.step_env() == {"HPR_RESTORE_MAX_STEP": "7", "HPR_SKIP_STEPS": "8-8"}
    restored = [e for e in map(json.loads, store.events_path.read_text().splitlines()) if "restored" in e["event"]]
    assert restored[-1]["named"] == "n2:1" and restored[-1]["skip"] == "8-8"
    _beat(progress, 21, "replica=bad bad_rank=3 bad_node=n2")  # named a second time, across the requeue
    v = again.poll(3.0, Step())
    assert v is not None and v.nodes == ("n2",) and v.mark is not None
    _beat(progress, 30, "loss=inf")  # the rollback budget was spent before the requeue
    stop = again.poll(4.0, Step())
    assert stop is not None and stop.trip is not None and stop.trip.rule == STOP_RULE


@pytest.mark.parametrize(
    "junk",
    [
        "not a mapping",
        {"named": ["n2"], "last_ok": "10", "restore_max": -5, "skips": [[9, 3], ["a", 1], [1]], "rollbacks": True},
        {"named": {f"n{i}": 1 for i in range(1000)}, "skips": [[i, i] for i in range(1000)], "tainted_to": 1e300},
    ],
)
def test_junk_in_the_state_files_integrity_record_is_dropped_and_bounded(tmp_path: Path, junk: Any) -> None:
    store = WrapperStateStore(tmp_path, JOB)
    state = store.load()
    state.integrity = junk
    store.save(state)
    watch, _, _ = _requeued(tmp_path)
    assert len(watch.named) <= 64 and len(watch.skips) <= 64
    assert watch.last_ok is None and watch.restore_max is None and watch.rollbacks == 0
    assert watch.tainted_to == -1 and all(a <= b for a, b in watch.skips)
    assert len(json.dumps(watch.to_record())) < 10_000
