"""Checks as tables: what a check looks for is a tuple of rules (when, how, key, text), applied to each thing
it reads (a GPU, the node's GPU census, a Neuron counter). A check's `run` reads the hardware and applies its
table; docs/design.md lists the tables.

`how` says what a finding asks for: a warning, a reboot, a replacement, or the escalation ladder (a reboot,
then a replacement once the same fault has survived `reboots_before_replace` boots, counted per key on disk).
It is fixed or read from the check's options (an operator may turn a replacement into a warning).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

from hpresilience.health.base import AnyCheck, CheckContext, CheckResult
from hpresilience.health.checks.common import ladder
from hpresilience.reasons import Action

S = TypeVar("S")
OptT = TypeVar("OptT")


class How(StrEnum):
    """What a finding asks for; the values are the words options and catalogues use for it."""

    WARN = "warn"
    REBOOT = "reboot"
    REPLACE = "replace"
    REBOOT_THEN_REPLACE = "reboot_then_replace"

    @classmethod
    def of(cls, word: str) -> How:
        """A catalogue's or an option's word; "none" and any word not ours only warn."""
        try:
            return cls(word)
        except ValueError:
            return cls.WARN


def judge(ctx: CheckContext, how: How, key: str) -> tuple[Action, int | None]:
    """The action `how` asks for `key`, and the boots the fault has been seen in (None off the ladder)."""
    if how is How.REBOOT_THEN_REPLACE:
        return ladder(ctx, key)
    return {How.REBOOT: Action.REBOOT, How.REPLACE: Action.REPLACE}.get(how, Action.NONE), None


def _no_evidence(subject: Any, options: Any) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Rule(Generic[S, OptT]):
    """One thing to look for in a subject `S` under options `OptT`."""

    # The finding's key; ":<device>" follows when the rule is applied to a device.
    key: str
    # Whether the subject shows the fault.
    when: Callable[[S, OptT], bool]
    # What the finding asks for: fixed, or chosen by the options.
    how: How | Callable[[OptT], How]
    # What the finding says (after "<where>: " when the rule is applied to a device).
    text: Callable[[S, OptT], str]
    # The finding's own evidence, besides what the check gives every finding of the subject.
    evidence: Callable[[S, OptT], dict[str, Any]] = _no_evidence
    # False: a sighting must repeat before the agent acts (a count that may be a slow start). A warning never is.
    certain: bool = True
    # Within a grace period (just booted, driver just changed) the finding only warns.
    held_in_grace: bool = False


def apply(
    check: AnyCheck,
    rules: Iterable[Rule[S, OptT]],
    subject: S,
    options: OptT,
    *,
    where: str = "",
    device: str = "",
    evidence: dict[str, Any] | None = None,
    grace: str = "",
) -> list[CheckResult]:
    """The findings of every rule that matches `subject`, in table order (the ladder counts only those)."""
    out: list[CheckResult] = []
    for rule in rules:
        if not rule.when(subject, options):
            continue
        how = rule.how if isinstance(rule.how, How) else rule.how(options)
        text = rule.text(subject, options)
        if grace and rule.held_in_grace:
            how, text = How.WARN, f"{text} ({grace})"
        key = f"{rule.key}:{device}" if device else rule.key
        action, boots = judge(check.ctx, how, key)
        detail = {**(evidence or {}), **rule.evidence(subject, options)}
        if boots is not None:
            detail["boots_seen"] = boots
        certain = rule.certain and how is not How.WARN
        out.append(check.finding(f"{where}: {text}" if where else text, action, key, certain, detail))
    return out
