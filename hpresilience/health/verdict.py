"""Folding one run's results into a node verdict: which result wins, and whether it is certain.

Pure: no I/O, no clock. Order of precedence, worst first:
  fail+replace > fail+reboot > fail (no action) > unknown > warn > ok > not_applicable
and among equals a certain result wins over one that needs a repeat. `unknown` never carries an
action (the runner enforces it), so an agent-side error cannot become a replacement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpresilience.health.base import CheckResult, Status
from hpresilience.reasons import Action

STATUS_RANK = {Status.NOT_APPLICABLE: 0, Status.OK: 1, Status.WARN: 2, Status.UNKNOWN: 3, Status.FAIL: 4}


def severity(r: CheckResult) -> tuple[int, int, int]:
    return (STATUS_RANK[r.status], r.action.rank, int(r.certain))


def worst(results: Sequence[CheckResult]) -> CheckResult:
    """The result that decides: a node verdict, a check's sub-results, the agent's guard all pick with this."""
    return max(results, key=severity)


@dataclass(frozen=True)
class Verdict:
    status: Status
    action: Action
    # True: act on this run alone; False: the deciding fault should be seen again before acting.
    certain: bool
    reason: str
    deciding: CheckResult | None
    results: tuple[CheckResult, ...]

    @property
    def needs_repeat(self) -> bool:
        return self.action != Action.NONE and not self.certain

    @property
    def failed(self) -> bool:
        return self.status == Status.FAIL

    @property
    def exit_code(self) -> int:
        """HealthCheckProgram / prolog convention: 1 when a check fails, else 0."""
        return 1 if self.failed else 0

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Status}
        for r in self.results:
            out[r.status.value] += 1
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "status": self.status.value,
            "action": self.action.value,
            "certain": self.certain,
            "needs_repeat": self.needs_repeat,
            "reason": self.reason,
            "deciding_check": self.deciding.check if self.deciding else None,
            "counts": self.counts(),
        }


def aggregate(results: Sequence[CheckResult]) -> Verdict:
    if not results:
        return Verdict(Status.NOT_APPLICABLE, Action.NONE, False, "no checks ran", None, ())
    deciding = worst(results)
    if deciding.status in (Status.OK, Status.NOT_APPLICABLE):
        applicable = sum(1 for r in results if r.status == Status.OK)
        return Verdict(deciding.status, Action.NONE, False, f"{applicable} check(s) passed", None, tuple(results))
    action = deciding.action if deciding.status == Status.FAIL else Action.NONE
    return Verdict(
        deciding.status,
        action,
        deciding.certain and action != Action.NONE,
        f"{deciding.check}: {deciding.reason}",
        deciding,
        tuple(results),
    )
