"""Folding one run's results into a node verdict: which result wins, and whether it is certain.

Pure: no I/O, no clock. Order of precedence, worst first:
  fail+replace > fail+reboot > fail (no action) > unknown > warn > ok > not_applicable
and among equals a certain result wins over one that needs a repeat. `unknown` never carries an
action (the runner enforces it), so an agent-side error cannot become a replacement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpresilience.health.base import ACTION_RANK, CheckResult, Status, SuggestedAction

STATUS_RANK = {Status.NOT_APPLICABLE: 0, Status.OK: 1, Status.WARN: 2, Status.UNKNOWN: 3, Status.FAIL: 4}


def severity(r: CheckResult) -> tuple[int, int, int]:
    return (STATUS_RANK[r.status], ACTION_RANK[r.action], int(r.certain))


@dataclass(frozen=True)
class Verdict:
    status: Status
    action: SuggestedAction
    # True: act on this run alone; False: the deciding fault should be seen again before acting.
    certain: bool
    reason: str
    deciding: CheckResult | None
    results: tuple[CheckResult, ...]

    @property
    def needs_repeat(self) -> bool:
        return self.action != SuggestedAction.NONE and not self.certain

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
        return Verdict(Status.NOT_APPLICABLE, SuggestedAction.NONE, False, "no checks ran", None, ())
    worst = max(results, key=severity)
    if worst.status in (Status.OK, Status.NOT_APPLICABLE):
        applicable = sum(1 for r in results if r.status == Status.OK)
        return Verdict(
            worst.status, SuggestedAction.NONE, False, f"{applicable} check(s) passed", None, tuple(results)
        )
    action = worst.action if worst.status == Status.FAIL else SuggestedAction.NONE
    return Verdict(
        worst.status,
        action,
        worst.certain and action != SuggestedAction.NONE,
        f"{worst.check}: {worst.reason}",
        worst,
        tuple(results),
    )
