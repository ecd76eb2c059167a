"""Restart policy: sliding window, escalation to a full restart, caps, application errors, persistence."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hpresilience.autoresume.decide.policy import FailureKind, PolicyChoice, RestartPolicy
from hpresilience.autoresume.settings import RunPolicySettings
from hpresilience.errors import ConfigError

HOUR = 3600.0


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def settings(**kw: Any) -> RunPolicySettings:
    base: dict[str, Any] = {
        "jobMaxRetryCount": 50,
        "restartPolicy": {"numRestartBeforeFullJobRestart": 3, "evalPeriodSeconds": 6 * HOUR, "maxFullJobRestarts": 1},
    }
    base.update(kw)
    return RunPolicySettings.model_validate(base)


def test_three_restarts_in_the_window_then_one_full_restart_then_give_up() -> None:
    clock = Clock()
    p = RestartPolicy(settings(), clock)
    actions = []
    for _ in range(8):
        clock.t += 60
        actions.append(p.decide(FailureKind.NODE_FAULT).choice)
    assert actions == [PolicyChoice.RESTART_STEP] * 3 + [PolicyChoice.FULL_RESTART] + [
        PolicyChoice.RESTART_STEP
    ] * 3 + [PolicyChoice.GIVE_UP]
    last = p.decide(FailureKind.RULE_TRIPPED)
    assert last.reason == "full_restart_budget_exhausted" and "maxFullJobRestarts=1" in last.detail


def test_window_slides_so_spread_out_failures_never_escalate() -> None:
    clock = Clock()
    p = RestartPolicy(settings(), clock)
    for _ in range(10):
        clock.t += 2 * HOUR + 1  # at most 2 restarts within any 6 h
        d = p.decide(FailureKind.RULE_TRIPPED)
        assert d.choice is PolicyChoice.RESTART_STEP and d.restarts_in_window <= 3
    assert p.process_restarts == 10 and p.full_restarts == 0


def test_restart_exactly_eval_period_ago_has_left_the_window() -> None:
    clock = Clock()
    p = RestartPolicy(settings(restartPolicy={"numRestartBeforeFullJobRestart": 1, "evalPeriodSeconds": 100}), clock)
    p.decide(FailureKind.NODE_FAULT)
    clock.t += 99.9
    assert p.restarts_in_window() == 1
    clock.t += 0.1
    assert p.decide(FailureKind.NODE_FAULT).choice is PolicyChoice.RESTART_STEP


def test_job_max_retry_count_caps_process_restarts_over_the_job_life() -> None:
    clock = Clock()
    p = RestartPolicy(settings(jobMaxRetryCount=2), clock)
    for _ in range(2):
        clock.t += 7 * HOUR
        assert p.decide(FailureKind.NODE_FAULT).choice is PolicyChoice.RESTART_STEP
    clock.t += 7 * HOUR
    d = p.decide(FailureKind.NODE_FAULT)
    assert (d.choice, d.reason) == (PolicyChoice.GIVE_UP, "retry_budget_exhausted")


def test_zero_restarts_before_full_restart_goes_straight_to_requeue() -> None:
    p = RestartPolicy(settings(restartPolicy={"numRestartBeforeFullJobRestart": 0, "maxFullJobRestarts": 2}), Clock())
    assert [p.decide(FailureKind.NODE_FAULT).choice for _ in range(3)] == [
        PolicyChoice.FULL_RESTART,
        PolicyChoice.FULL_RESTART,
        PolicyChoice.GIVE_UP,
    ]


def test_application_error_is_not_retried_by_default() -> None:
    p = RestartPolicy(settings(), Clock())
    d = p.decide(FailureKind.APPLICATION_ERROR, exit_code=1)
    assert (d.choice, d.reason) == (PolicyChoice.GIVE_UP, "application_error") and p.process_restarts == 0


def test_application_errors_retried_at_most_the_allowed_count() -> None:
    clock = Clock()
    p = RestartPolicy(settings(retryOnApplicationError=2), clock)
    got = []
    for _ in range(3):
        clock.t += 7 * HOUR
        got.append(p.decide(FailureKind.APPLICATION_ERROR, exit_code=1).choice)
    assert got == [PolicyChoice.RESTART_STEP, PolicyChoice.RESTART_STEP, PolicyChoice.GIVE_UP]
    clock.t += 7 * HOUR
    assert p.decide(FailureKind.NODE_FAULT).choice is PolicyChoice.RESTART_STEP  # faults keep their own budget


def test_application_errors_retried_like_faults_when_true() -> None:
    clock = Clock()
    p = RestartPolicy(settings(retryOnApplicationError=True, jobMaxRetryCount=4), clock)
    for _ in range(4):
        clock.t += 7 * HOUR
        assert p.decide(FailureKind.APPLICATION_ERROR, exit_code=1).choice is PolicyChoice.RESTART_STEP
    assert p.decide(FailureKind.APPLICATION_ERROR, exit_code=1).reason == "retry_budget_exhausted"


def test_no_retry_exit_code_wins_over_any_budget() -> None:
    p = RestartPolicy(settings(noRetryExitCodes=[93], retryOnApplicationError=True), Clock())
    d = p.decide(FailureKind.NODE_FAULT, exit_code=93)
    assert (d.choice, d.reason) == (PolicyChoice.GIVE_UP, "no_retry_exit_code")
    assert p.decide(FailureKind.NODE_FAULT, exit_code=1).choice is PolicyChoice.RESTART_STEP


def test_no_replacement_follows_the_fallback() -> None:
    p = RestartPolicy(settings(), Clock())
    assert p.no_replacement("fail").choice is PolicyChoice.GIVE_UP
    assert p.no_replacement("requeue").choice is PolicyChoice.FULL_RESTART
    assert p.no_replacement("requeue").reason == "full_restart_budget_exhausted"


def test_state_survives_a_requeue_through_json() -> None:
    clock = Clock()
    p = RestartPolicy(settings(retryOnApplicationError=3), clock)
    for kind in (FailureKind.NODE_FAULT, FailureKind.APPLICATION_ERROR):
        clock.t += 10
        p.decide(kind)
    q = RestartPolicy.from_dict(settings(retryOnApplicationError=3), json.loads(json.dumps(p.to_dict())), clock)
    assert (q.process_restarts, q.application_restarts, q.restarts_in_window()) == (2, 1, 2)
    clock.t += 10
    assert q.decide(FailureKind.NODE_FAULT).choice is PolicyChoice.RESTART_STEP
    clock.t += 10
    assert q.decide(FailureKind.NODE_FAULT).choice is PolicyChoice.FULL_RESTART  # the restored window counts


def test_slurm_restart_count_uses_up_the_full_restart_budget() -> None:
    p = RestartPolicy(settings(restartPolicy={"numRestartBeforeFullJobRestart": 0, "maxFullJobRestarts": 1}), Clock())
    p.observe_job_start(1)  # Slurm requeued the job itself once already
    assert p.decide(FailureKind.NODE_FAULT).choice is PolicyChoice.GIVE_UP
    p.observe_job_start(0)
    assert p.full_restarts == 1  # never counts down


@pytest.mark.parametrize(
    "data",
    [
        {"version": 2},
        {"version": 1, "process_restarts": -1},
        {"version": 1, "full_restarts": "x"},
        {"version": 1, "window": "x"},
        {"version": 1, "window": ["soon"]},
    ],
)
def test_unreadable_state_is_a_clear_error(data: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="restart policy state is not readable"):
        RestartPolicy.from_dict(settings(), data)
