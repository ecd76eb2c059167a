"""The agent on a cloud notice, over a stand-in for Slurm: one planned drain (never repeated, never over a
person's reason), the node notice file, the notice withdrawn, and the guard rails that must not undo it."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpresilience.agent.daemon import Agent
from hpresilience.agent.guard import DecisionKind, FleetView, Memory, decide, over_ceiling
from hpresilience.agent.notices import Notice, NoticeUnavailable, NoticeWatcher
from hpresilience.agent.settings import AgentSettings, NoticeSettings
from hpresilience.health.base import CheckResult, Kind, Status
from hpresilience.reasons import Action, PlannedKind, agent_reason, parse_planned, planned_reason
from hpresilience.slurm.models import Node, ReasonGroup

OK = CheckResult("gpu.count", "gpu", Kind.PASSIVE, Status.OK, reason="8 GPU(s) present")
XID = CheckResult("xid", "xid", Kind.PASSIVE, Status.FAIL, Action.REPLACE, "XID 79", key="x79", certain=True)


class Slurm:
    """The calls the agent makes, over one node."""

    def __init__(self, reason: str = "", states: Iterable[str] = ("IDLE",)) -> None:
        self.me = Node(name="n1", address="", hostname="", states=frozenset(states), reason=reason)
        self.updates: list[tuple[str, str]] = []
        self.reads = 0

    def node(self, name: str) -> Node:
        self.reads += 1
        return self.me

    def reason_groups(self, partitions: Iterable[str] = ()) -> list[ReasonGroup]:
        return [
            ReasonGroup("p", 1, ("n1",), self.me.reason if self.me.is_unavailable else ""),
            ReasonGroup("p", 99, tuple(f"x{i}" for i in range(99))),
        ]

    def set_node_state(self, names: Iterable[str], action: str, reason: str = "") -> None:
        self.updates.append((action, reason))
        states = {"fail": {"IDLE", "FAIL"}, "drain": {"IDLE", "DRAIN"}, "resume": {"IDLE"}}[action]
        self.me = replace(self.me, states=frozenset(states), reason=reason)


class Checks:
    def __init__(self, *results: CheckResult) -> None:
        self.results = list(results)

    def passive(self) -> Sequence[CheckResult]:
        return self.results

    def active(self) -> Sequence[CheckResult]:
        return []

    def wait_event(self, timeout: float) -> bool:
        return False


class Cloud:
    name = "cloud"

    def __init__(self) -> None:
        self.now: list[Notice] | Exception = []

    def poll(self) -> Sequence[Notice]:
        if isinstance(self.now, Exception):
            raise self.now
        return self.now


DEADLINE = float(int(time.time()) + 120)
RECLAIM = Notice(PlannedKind.RECLAIM, DEADLINE, "ec2 spot terminate", "cloud", "spot")
REASON = (
    f"[hpr-agent] Planned:Reclaim by {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(DEADLINE))} ec2 spot terminate"
)


def make(tmp_path: Path, slurm: Slurm, cloud: Cloud, checks: Checks | None = None, **kw: Any) -> Agent:
    notices = NoticeSettings(notice_file=str(tmp_path / "run" / "notice.json"))
    settings = AgentSettings(
        node_name="n1",
        state_dir=str(tmp_path / "state"),
        metrics_address="",
        active_checks=False,
        notices=notices,
        **kw,
    )
    a = Agent(settings, slurm, checks or Checks(OK))  # type: ignore[arg-type]
    a.notices = NoticeWatcher(notices, [cloud])
    return a


def test_a_reclaim_drains_the_node_once_with_the_planned_reason_and_writes_the_notice_file(tmp_path: Path) -> None:
    slurm, cloud = Slurm(), Cloud()
    a = make(tmp_path, slurm, cloud)
    a.cycle()  # the first cycle after a start reads the node once (is a mark of ours on it?)
    a.cycle()
    assert slurm.updates == [] and slurm.reads == 1  # no notice: Slurm is not asked
    cloud.now = [RECLAIM]
    for _ in range(3):
        a.cycle()
    assert slurm.updates == [("drain", REASON)] and slurm.reads == 2  # once, not every cycle
    assert slurm.me.has("DRAIN") and parse_planned(slurm.me.reason) is not None
    path = tmp_path / "run" / "notice.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert path.stat().st_uid == os.geteuid() and '"kind": "Reclaim"' in path.read_text()
    # A restarted agent remembers it acted (state file): no second drain, no read.
    b = make(tmp_path, slurm, cloud)
    b.cycle()
    b.cycle()
    assert slurm.updates == [("drain", REASON)] and slurm.reads == 2
    assert (
        a.registry.get_sample_value("hpr_agent_planned_drains_total", {"kind": "Reclaim", "decision": "drained"}) == 1
    )


def test_a_persons_reason_is_not_overwritten_but_the_ranks_are_still_told(tmp_path: Path) -> None:
    slurm, cloud = Slurm("fan broken, ticket 42", ("IDLE", "DRAIN")), Cloud()
    cloud.now = [RECLAIM]
    a = make(tmp_path, slurm, cloud)
    a.cycle()
    a.cycle()
    assert slurm.updates == [] and slurm.me.reason == "fan broken, ticket 42" and slurm.reads == 1
    assert (tmp_path / "run" / "notice.json").exists()


def test_a_withdrawn_notice_resumes_only_our_planned_drain_and_removes_the_file(tmp_path: Path) -> None:
    slurm, cloud = Slurm(), Cloud()
    cloud.now = [RECLAIM]
    a = make(tmp_path, slurm, cloud)
    a.cycle()
    cloud.now = NoticeUnavailable("timeout")
    a.cycle()  # no answer is no news: the drain and the file stay
    assert slurm.me.has("DRAIN") and (tmp_path / "run" / "notice.json").exists()
    cloud.now = []
    a.cycle()
    assert slurm.updates[-1] == ("resume", "") and not slurm.me.is_unavailable
    assert not (tmp_path / "run" / "notice.json").exists()
    a.cycle()
    assert len(slurm.updates) == 2  # said once


def test_clear_checks_do_not_lift_a_planned_drain_and_a_fault_still_escalates(tmp_path: Path) -> None:
    slurm, cloud = Slurm(REASON, ("IDLE", "DRAIN")), Cloud()
    cloud.now = [RECLAIM]
    checks = Checks(OK)
    a = make(tmp_path, slurm, cloud, checks)
    a.cycle()
    assert slurm.updates == []  # the drain is there already: neither re-drained nor resumed as "cleared"
    d = decide(slurm.me, [slurm.me], [OK], Memory(), AgentSettings(), time.time())
    assert d.kind is DecisionKind.NONE
    checks.results = [XID]
    a.cycle()
    assert slurm.updates[-1][0] == "fail" and slurm.updates[-1][1].startswith("Action:Replace [hpr-agent]")
    a.cycle()
    assert len(slurm.updates) == 1  # the fault mark stands; the notice does not put Planned back over it


def test_observe_mode_drains_nothing_and_writes_no_file(tmp_path: Path) -> None:
    slurm, cloud = Slurm(), Cloud()
    cloud.now = [RECLAIM]
    a = make(tmp_path, slurm, cloud, mode="observe")
    a.cycle()
    assert slurm.updates == [] and not (tmp_path / "run" / "notice.json").exists()
    assert (
        a.registry.get_sample_value("hpr_agent_planned_drains_total", {"kind": "Reclaim", "decision": "would_drain"})
        == 1
    )


def test_a_notice_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir(mode=0o777)
    os.chmod(tmp_path / "run", 0o777)
    slurm, cloud = Slurm(), Cloud()
    cloud.now = [RECLAIM]
    make(tmp_path, slurm, cloud).cycle()
    assert not (tmp_path / "run" / "notice.json").exists()
    assert slurm.updates == [("drain", REASON)]  # the wrapper still learns it from Slurm


@pytest.mark.parametrize("kind", list(PlannedKind))
def test_planned_drains_do_not_count_against_the_fleet_ceiling(kind: PlannedKind) -> None:
    """Ten nodes, ceiling 1: a reclaimed neighbour does not hold this node's fault mark; a fault mark does."""
    settings = AgentSettings(max_out_fraction=0.1, max_out_min=1)
    planned = ReasonGroup("p", 1, ("x0",), planned_reason(kind, DEADLINE, "ec2 spot terminate"))
    faulty = ReasonGroup("p", 1, ("x0",), agent_reason(Action.REPLACE, "xid 79"))
    rest = ReasonGroup("p", 9, tuple(f"n{i}" for i in range(1, 10)))
    assert over_ceiling(FleetView([planned, rest]), "n1", settings) is None
    assert over_ceiling(FleetView([faulty, rest]), "n1", settings) is not None


def test_between_cycles_a_new_or_withdrawn_notice_is_news_that_runs_a_cycle_at_once(tmp_path: Path) -> None:
    slurm, cloud = Slurm(), Cloud()
    a = make(tmp_path, slurm, cloud)
    a.cycle()
    assert not a.notice_news()
    cloud.now = [RECLAIM]
    a.next_notice_poll = 0.0
    assert a.notice_news() and slurm.updates == []  # news only: the cycle acts
    a.cycle()
    a.next_notice_poll = 0.0
    assert not a.notice_news()  # acted on already
    assert not a.notice_news()  # and not asked again before poll_interval_s
    cloud.now = []
    a.next_notice_poll = 0.0
    assert a.notice_news()


def test_no_active_checks_on_a_node_drained_for_a_notice(tmp_path: Path) -> None:
    a = make(tmp_path, Slurm(), Cloud())
    a.settings = a.settings.model_copy(update={"active_checks": True})
    drained = Node(name="n1", address="", hostname="", states=frozenset({"IDLE", "DRAIN"}), reason=REASON)
    marked = replace(drained, reason=agent_reason(Action.REBOOT, "row remap pending"))
    assert not a.active_allowed(drained) and a.active_allowed(marked)
