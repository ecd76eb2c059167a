"""Verdict aggregation: which result wins, and certain vs needs-repeat."""

from __future__ import annotations

from hpresilience.health.base import CheckResult, Kind, Status
from hpresilience.health.verdict import aggregate
from hpresilience.reasons import Action


def res(name: str, status: Status, action: Action = Action.NONE, certain: bool = False) -> CheckResult:
    return CheckResult(name, "t", Kind.PASSIVE, status, action, f"{name} reason", {}, f"k:{name}", certain)


def test_all_ok_or_not_applicable_is_ok_with_exit_0() -> None:
    v = aggregate([res("a", Status.OK), res("b", Status.NOT_APPLICABLE)])
    assert (v.status, v.action, v.exit_code, v.needs_repeat) == (Status.OK, Action.NONE, 0, False)
    assert aggregate([res("b", Status.NOT_APPLICABLE)]).status == Status.NOT_APPLICABLE
    assert aggregate([]).exit_code == 0


def test_replace_beats_reboot_and_certain_beats_uncertain() -> None:
    v = aggregate(
        [
            res("r", Status.FAIL, Action.REBOOT, True),
            res("x", Status.FAIL, Action.REPLACE, False),
            res("w", Status.WARN),
        ]
    )
    assert (v.action, v.deciding.check if v.deciding else None, v.certain, v.needs_repeat) == (
        Action.REPLACE,
        "x",
        False,
        True,
    )
    v = aggregate(
        [
            res("r1", Status.FAIL, Action.REBOOT, False),
            res("r2", Status.FAIL, Action.REBOOT, True),
        ]
    )
    assert v.deciding is not None and v.deciding.check == "r2" and v.certain and not v.needs_repeat


def test_unknown_outranks_warn_but_never_carries_an_action_and_exits_0() -> None:
    v = aggregate([res("u", Status.UNKNOWN), res("w", Status.WARN)])
    assert (v.status, v.action, v.exit_code) == (Status.UNKNOWN, Action.NONE, 0)


def test_fail_exits_1_even_without_an_action() -> None:
    v = aggregate([res("f", Status.FAIL), res("u", Status.UNKNOWN)])
    assert (v.status, v.exit_code, v.action) == (Status.FAIL, 1, Action.NONE)
    assert v.counts()["fail"] == 1 and v.to_dict()["deciding_check"] == "f"
