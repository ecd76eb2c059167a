"""Restart policy: HyperPod's `runPolicy` mapped onto Slurm, with exact, documented window semantics.

Two kinds of restart (docs/auto-resume-rules.md has the long form):
- process-level restart: the step is relaunched inside the same allocation (same job id, a new
  `srun` step), on the same nodes, on a hot spare, or on a replacement node;
- full restart: the whole batch job is requeued (`scontrol requeue`): same job id, a fresh
  allocation, the batch script runs again from the top and SLURM_RESTART_COUNT grows by one.

On each failure, in this order: an exit code in `noRetryExitCodes` gives up; an application error
gives up unless `retryOnApplicationError` still allows one; `jobMaxRetryCount` process-level restarts
in the job's whole life give up; `numRestartBeforeFullJobRestart` process-level restarts already in the
sliding window of the last `evalPeriodSeconds` escalate to a full restart, which clears the window, as
long as fewer than `maxFullJobRestarts` were made; otherwise the step restarts in place. Times are wall
clock (epoch seconds) so the state, which the wrapper persists by job id (`to_dict`, state.py), stays
meaningful after a requeue on other nodes.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpresilience.autoresume.settings import RunPolicySettings
from hpresilience.errors import ConfigError

STATE_VERSION = 1


class FailureKind(enum.Enum):
    APPLICATION_ERROR = "application_error"  # the step failed and no fault outside the program was found
    RULE_TRIPPED = "rule_tripped"  # a log rule reported HANGING, SLOW or FAULTED
    NODE_FAULT = "node_fault"  # a node failed, drained, or was marked for repair
    DIVERGED = "diverged"  # the training state is wrong and the user's loss_policy says stop: never retried
    RERUN_REQUESTED = "rerun_requested"  # the program asked for a rerun elsewhere (not its error)


class PolicyChoice(enum.Enum):
    """What the restart policy chooses for a failed step. Not `reasons.Action` (what a fault asks of a node):
    the value is the word the wrapper records as a decision's `action` (`policy_decided`)."""

    RESTART_STEP = "restart_step"  # process-level restart: relaunch the step in the allocation
    FULL_RESTART = "full_restart"  # requeue the whole batch job
    GIVE_UP = "give_up"  # the job ends failed


@dataclass(frozen=True)
class Decision:
    choice: PolicyChoice
    reason: str  # stable slug for logs and metrics
    detail: str
    process_restarts: int
    full_restarts: int
    restarts_in_window: int


class RestartPolicy:
    """Counts restarts for one job and decides what each failure leads to. Serialisable via to_dict."""

    def __init__(self, settings: RunPolicySettings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self.process_restarts = 0
        self.full_restarts = 0
        self.application_restarts = 0
        self._window: list[float] = []  # times of process-level restarts since the last full restart

    def restarts_in_window(self, now: float | None = None) -> int:
        now = self._clock() if now is None else now
        self._prune(now)
        return len(self._window)

    def _prune(self, now: float) -> None:
        horizon = now - self.settings.restart_policy.eval_period_seconds
        # Strictly newer than the horizon: a restart exactly evalPeriodSeconds ago has left the window.
        self._window = [t for t in self._window if t > horizon]

    def _decision(self, choice: PolicyChoice, reason: str, detail: str) -> Decision:
        return Decision(choice, reason, detail, self.process_restarts, self.full_restarts, len(self._window))

    def _application_allowed(self) -> bool:
        allow = self.settings.retry_on_application_error
        if isinstance(allow, bool):
            return allow
        return self.application_restarts < allow

    def decide(self, kind: FailureKind, exit_code: int | None = None, now: float | None = None) -> Decision:
        """What to do about a failed attempt; the decision is recorded in the counters."""
        now = self._clock() if now is None else now
        self._prune(now)
        if kind is FailureKind.DIVERGED:
            return self._decision(PolicyChoice.GIVE_UP, "training_diverged", "loss_policy stops a diverged job")
        if exit_code is not None and exit_code in self.settings.no_retry_exit_codes:
            return self._decision(
                PolicyChoice.GIVE_UP, "no_retry_exit_code", f"exit code {exit_code} is in noRetryExitCodes"
            )
        if kind is FailureKind.APPLICATION_ERROR and not self._application_allowed():
            return self._decision(
                PolicyChoice.GIVE_UP,
                "application_error",
                f"application error (exit code {exit_code}) and retryOnApplicationError allows "
                f"no more ({self.application_restarts} retried)",
            )
        if self.process_restarts >= self.settings.job_max_retry_count:
            return self._decision(
                PolicyChoice.GIVE_UP,
                "retry_budget_exhausted",
                f"{self.process_restarts} process-level restarts reached jobMaxRetryCount="
                f"{self.settings.job_max_retry_count}",
            )
        rp = self.settings.restart_policy
        if len(self._window) >= rp.num_restart_before_full_job_restart:
            return self._full_restart(
                f"{len(self._window)} process-level restarts within evalPeriodSeconds={rp.eval_period_seconds:g} "
                f"(numRestartBeforeFullJobRestart={rp.num_restart_before_full_job_restart})",
                kind,
            )
        self.process_restarts += 1
        if kind is FailureKind.APPLICATION_ERROR:
            self.application_restarts += 1
        self._window.append(now)
        return self._decision(
            PolicyChoice.RESTART_STEP,
            "within_budget",
            f"process-level restart {self.process_restarts} of {self.settings.job_max_retry_count}",
        )

    def no_replacement(self, fallback: str, now: float | None = None) -> Decision:
        """A restart needs a node that did not come: requeue (if the budget allows) or fail, per `fallback`."""
        now = self._clock() if now is None else now
        self._prune(now)
        if fallback == "fail":
            return self._decision(PolicyChoice.GIVE_UP, "no_replacement", "no replacement node and fallback is fail")
        return self._full_restart("no replacement node within replace_timeout_s", None)

    def _full_restart(self, why: str, kind: FailureKind | None) -> Decision:
        cap = self.settings.restart_policy.max_full_job_restarts
        if self.full_restarts >= cap:
            return self._decision(
                PolicyChoice.GIVE_UP,
                "full_restart_budget_exhausted",
                f"{why}; {self.full_restarts} full restarts reached maxFullJobRestarts={cap}",
            )
        self.full_restarts += 1
        if kind is FailureKind.APPLICATION_ERROR:
            self.application_restarts += 1
        # The requeued job starts afresh on a new allocation, so its window starts empty.
        self._window.clear()
        return self._decision(
            PolicyChoice.FULL_RESTART, "escalated", f"{why}; full restart {self.full_restarts} of {cap}"
        )

    def observe_job_start(self, slurm_restart_count: int) -> None:
        """Sync with SLURM_RESTART_COUNT: requeues Slurm made by itself also used the full-restart budget."""
        self.full_restarts = max(self.full_restarts, slurm_restart_count)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "process_restarts": self.process_restarts,
            "full_restarts": self.full_restarts,
            "application_restarts": self.application_restarts,
            "window": list(self._window),
        }

    @classmethod
    def from_dict(
        cls, settings: RunPolicySettings, data: dict[str, Any], clock: Callable[[], float] = time.time
    ) -> RestartPolicy:
        try:
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {STATE_VERSION}")
            p = cls(settings, clock)
            p.process_restarts = _count(data, "process_restarts")
            p.full_restarts = _count(data, "full_restarts")
            p.application_restarts = _count(data, "application_restarts")
            window = data.get("window", [])
            if not isinstance(window, list):
                raise ValueError("window is not a list")
            p._window = sorted(float(t) for t in window)
        except (TypeError, ValueError, AttributeError) as err:
            raise ConfigError(f"restart policy state is not readable: {err}") from None
        return p


def _count(data: dict[str, Any], key: str) -> int:
    v = data.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{key} must be a count >= 0, got {v!r}")
    return v
