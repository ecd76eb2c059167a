"""A check's rule table (health/checks/rules.py): each matching rule is one finding, in table order, acting as
its `how` says (fixed, chosen by the options, or the reboot-then-replace ladder), held to a warning in a grace."""

from __future__ import annotations

from pathlib import Path

from hpresilience.health.base import Check, CheckContext, CheckOptions, Kind, Status
from hpresilience.health.checks.rules import How, Rule, apply
from hpresilience.reasons import Action


class ProbeOptions(CheckOptions):
    limit: int = 3
    over_limit: How = How.REPLACE


class Probe(Check[ProbeOptions]):
    name = "probe.rules"
    family = "probe"
    kind = Kind.PASSIVE
    Options = ProbeOptions


RULES: tuple[Rule[int, ProbeOptions], ...] = (
    Rule(
        "probe.over",
        lambda v, o: v > o.limit,
        lambda o: o.over_limit,
        lambda v, o: f"{v} over {o.limit}",
        lambda v, o: {"value": v},
    ),
    Rule("probe.odd", lambda v, o: v % 2 == 1, How.REBOOT_THEN_REPLACE, lambda v, o: "odd"),
    Rule("probe.big", lambda v, o: v > 100, How.REBOOT, lambda v, o: "big", certain=False, held_in_grace=True),
)


def probe(tmp_path: Path, **options: object) -> Probe:
    return Probe(ProbeOptions.model_validate(options), CheckContext(state_dir=tmp_path, reboots_before_replace=1))


def test_each_matching_rule_is_one_finding_in_table_order_with_its_key_text_and_evidence(tmp_path: Path) -> None:
    found = apply(probe(tmp_path), RULES, 5, probe(tmp_path).options, where="dev 0", device="d0", evidence={"dev": 0})
    assert [(f.key, f.reason, f.action, f.certain) for f in found] == [
        ("probe.over:d0", "dev 0: 5 over 3", Action.REPLACE, True),
        ("probe.odd:d0", "dev 0: odd", Action.REBOOT, True),
    ]
    assert found[0].evidence == {"dev": 0, "value": 5}
    assert found[1].evidence == {"dev": 0, "boots_seen": 1}
    assert apply(probe(tmp_path), RULES, 2, probe(tmp_path).options) == []


def test_the_options_choose_a_rules_action_and_a_warning_is_never_certain(tmp_path: Path) -> None:
    check = probe(tmp_path, over_limit="warn")
    (over,) = apply(check, RULES[:1], 4, check.options)
    assert (over.status, over.action, over.certain) == (Status.WARN, Action.NONE, False)


def test_a_rule_held_in_grace_only_warns_and_says_why(tmp_path: Path) -> None:
    check = probe(tmp_path)
    (big,) = apply(check, RULES[2:], 200, check.options, grace="booted 10 s ago")
    assert (big.status, big.action, big.reason) == (Status.WARN, Action.NONE, "big (booted 10 s ago)")
    (acting,) = apply(check, RULES[2:], 200, check.options)
    assert (acting.status, acting.action, acting.certain) == (Status.FAIL, Action.REBOOT, False)


def test_a_catalogue_word_not_ours_only_warns() -> None:
    assert [How.of(w) for w in ("none", "warn", "reboot", "reboot_then_replace", "reimage")] == [
        How.WARN,
        How.WARN,
        How.REBOOT,
        How.REBOOT_THEN_REPLACE,
        How.WARN,
    ]
