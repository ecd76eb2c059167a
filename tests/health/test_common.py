"""A check's sub-findings are CheckResults (Check.finding); the check reports the worst (checks.common.report)
and lists every one in its evidence in the documented shape."""

from __future__ import annotations

from hpresilience.health.base import Check, CheckContext, CheckOptions, CheckResult, Kind, Status
from hpresilience.health.checks.common import finding_dict, report
from hpresilience.reasons import Action


class Probe(Check[CheckOptions]):
    name = "probe.thing"
    family = "probe"
    kind = Kind.PASSIVE


def probe() -> Probe:
    return Probe(CheckOptions(), CheckContext())


def test_a_finding_fails_when_it_asks_for_an_action_and_warns_otherwise() -> None:
    c = probe()
    bad = c.finding("GPU 0 lost", Action.REBOOT, "gpu.lost:0", True, {"gpu": 0})
    meh = c.finding("PCIe x8", Action.NONE, "gpu.pcie:0", False, {"gpu": 0})
    assert isinstance(bad, CheckResult) and (bad.check, bad.family, bad.kind) == ("probe.thing", "probe", Kind.PASSIVE)
    assert (bad.status, bad.action, bad.key, bad.certain, bad.evidence) == (
        Status.FAIL,
        Action.REBOOT,
        "gpu.lost:0",
        True,
        {"gpu": 0},
    )
    assert (meh.status, meh.action) == (Status.WARN, Action.NONE) and not meh.asks_action and bad.asks_action


def test_report_is_the_worst_finding_with_the_runs_evidence() -> None:
    c = probe()
    warn = c.finding("PCIe x8", Action.NONE, "w", True, {})
    reboot = c.finding("pending", Action.REBOOT, "r", True, {})
    replace_unsure = c.finding("ecc", Action.REPLACE, "e", False, {})
    replace_sure = c.finding("remap failed", Action.REPLACE, "f", True, {})
    ev = {"findings": ["..."]}
    r = report([warn, reboot, replace_unsure, replace_sure], ev)
    assert (r.status, r.action, r.reason, r.key, r.certain, r.evidence) == (
        Status.FAIL,
        Action.REPLACE,
        "remap failed",
        "f",
        True,
        ev,
    )
    assert report([warn, reboot], {}).key == "r"
    only_warn = report([warn], {})
    assert (only_warn.status, only_warn.action, only_warn.certain) == (Status.WARN, Action.NONE, False)


def test_findings_are_listed_as_what_action_key_and_their_details() -> None:
    f = probe().finding("GPU 0 lost", Action.REPLACE, "gpu.lost:0", True, {"gpu": 0, "boots_seen": 3})
    assert finding_dict(f) == {
        "what": "GPU 0 lost",
        "action": "replace",
        "key": "gpu.lost:0",
        "gpu": 0,
        "boots_seen": 3,
    }
