"""The agent's collector (agent/collector.py): a profile's checks and the XID event sources, returning the
checks' own CheckResults, which the guard acts on without any translation in between."""

from __future__ import annotations

from pathlib import Path

from hpresilience.agent import collector as collector_module
from hpresilience.agent.collector import HealthCollector
from hpresilience.agent.guard import DecisionKind, Memory, decide
from hpresilience.agent.settings import AgentSettings
from hpresilience.health.base import CheckResult, Status
from hpresilience.health.events import KernelLogFollower
from hpresilience.reasons import Action, agent_reason, parse_reason
from hpresilience.slurm.models import Node
from hpresilience.testing.fakenode import FakeNode
from tests.health.conftest import node_settings


def idle(name: str = "n1") -> Node:
    return Node(name=name, address="", hostname="", states=frozenset({"IDLE"}))


def test_the_collector_lives_in_the_agent_package() -> None:
    """health/ must not know the agent (tests/test_layers.py): the collector is the agent's."""
    assert HealthCollector.__module__ == "hpresilience.agent.collector" == collector_module.__name__


def test_collector_runs_profile_checks_and_wakes_on_injected_faults(tmp_path: Path) -> None:
    node = FakeNode.make(tmp_path / "n", "p5.48xlarge")
    col = HealthCollector(node_settings(node), sources=[KernelLogFollower(str(node.kmsg))])
    try:
        assert "xid" in col.describe()["passive"] and "system.stress" in col.describe()["active"]
        healthy = col.passive()
        assert healthy and all(isinstance(r, CheckResult) for r in healthy)
        assert not any(r.asks_action for r in healthy)
        assert col.wait_event(0.1) is False
        node.inject("xid:79:0")
        assert col.wait_event(2) is True
        found = [r for r in col.passive() if r.asks_action]
        assert [r.check for r in found] == ["xid"]
        # The fault was observed when the event woke the loop: the latency metric starts there.
        assert found[0].action is Action.REBOOT and found[0].observed_at == col.last_event_at
    finally:
        col.close()


def test_decide_acts_on_the_collectors_results_as_they_come(tmp_path: Path) -> None:
    """Fault -> CheckResult -> Decision -> Slurm reason, one result type all the way: the xid check's result
    goes to decide() untouched and comes out as the mark, its check and reason in the Slurm reason."""
    node = FakeNode.make(tmp_path / "n", "p5.48xlarge")
    col = HealthCollector(node_settings(node), sources=[])
    try:
        assert decide(idle(), [idle()], col.passive(), Memory(), AgentSettings(), 0.0).kind is DecisionKind.NONE
        node.inject("xid:79:0")
        results = col.passive()
        [xid] = [r for r in results if r.status == Status.FAIL]
        d = decide(idle(), [idle()] * 10, results, Memory(), AgentSettings(), 0.0)
    finally:
        col.close()
    assert d.kind is DecisionKind.MARK and d.finding is xid and d.action is Action.REBOOT
    assert d.reason == agent_reason(Action.REBOOT, f"xid: {xid.reason}")
    parsed = parse_reason(d.reason)
    assert (parsed.action, parsed.owner) == (Action.REBOOT, "agent")


def test_open_event_sources_follows_the_configured_kernel_log(tmp_path: Path) -> None:
    node = FakeNode.make(tmp_path / "n", "p5.48xlarge")
    settings = node_settings(node).model_copy(update={"kernel_log": str(node.kmsg), "nvml": "off"})
    sources = collector_module.open_event_sources(settings)
    try:
        assert [type(s).__name__ for s in sources] == ["KernelLogFollower"]
    finally:
        for s in sources:
            s.close()


def test_a_checks_own_mode_reaches_the_agent_and_a_bad_mode_is_a_config_error(tmp_path: Path) -> None:
    """health.checks.NAME.mode: observe puts the check among those the agent only observes; another word is
    refused at load, naming the key."""
    import pytest
    import yaml

    from hpresilience.config import load_config
    from hpresilience.errors import ConfigError

    node = FakeNode.make(tmp_path / "n", "p5.48xlarge")
    cfg = tmp_path / "config.yaml"

    def write(mode: str) -> None:
        data = yaml.safe_load((node.root / "config.yaml").read_text())
        data["health"]["checks"]["xid"] = {"mode": mode}
        cfg.write_text(yaml.safe_dump(data))

    write("observe")
    col = HealthCollector(load_config(cfg).health, sources=[])
    assert col.observe_only == frozenset({"xid"})
    write("watch")
    with pytest.raises(ConfigError, match=r"checks.*xid.*mode"):
        load_config(cfg)
