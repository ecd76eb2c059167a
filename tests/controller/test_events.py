"""`hpresilience events`: the head node's record of what the agents and the controller decided, and why."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpresilience.agent.collector import HealthCollector
from hpresilience.agent.daemon import Agent
from hpresilience.agent.settings import AgentSettings
from hpresilience.cli import cli
from hpresilience.commands.events import parse_since
from hpresilience.config import load_config
from hpresilience.controller.events import EventLog
from hpresilience.controller.loop import Controller
from hpresilience.controller.selection import look
from hpresilience.controller.settings import ControllerSettings
from hpresilience.errors import ConfigError
from hpresilience.reasons import agent_reason
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.fakenode import FakeNode
from tests.controller.conftest import Scripts, history, settings_for, wait_until


def events_cli(*args: str) -> list[dict[str, object]]:
    out = CliRunner().invoke(cli, ["--json", "events", *args])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)  # type: ignore[no-any-return]


@pytest.mark.integration
def test_events_show_the_agents_mark_and_every_repair_step_by_whom_and_why(
    cluster: DevCluster,
    slurm: SlurmClient,
    scripts: Scripts,
    tmp_path: Path,
    start_controller: Callable[[Controller], Controller],
) -> None:
    """A real agent marks n2 for an XID 79; the controller records that mark (by the agent, with its reason),
    then its own steps through the gate to the resume; --node, --since and --json select and shape them."""
    node = FakeNode.make(tmp_path / "n2", "p5.48xlarge")
    node.inject("xid:79:0")
    agent = Agent(
        AgentSettings(node_name="n2", state_dir=str(tmp_path / "agent"), metrics_address="", active_checks=False),
        slurm,
        HealthCollector(load_config(node.root / "config.yaml").health, sources=[]),
    )
    assert agent.cycle().kind == "mark"
    state = tmp_path / "state"
    start_controller(Controller(settings_for(scripts, state), slurm))
    wait_until(lambda: history(state), "the repair of n2 to finish")
    got = events_cli("--state-dir", str(state), "--node", "n2")
    kinds = [e["kind"] for e in got]
    assert kinds[0] == "mark" and got[0]["by"] == "agent" and "[hpr-agent] xid" in str(got[0]["why"])
    steps = ["repair_detected", "repair_action_started", "node_came_back", "health_gate_passed", "node_resumed"]
    assert [k for k in kinds if k in steps] == steps
    gate = next(e for e in got if e["kind"] == "health_gate_passed")
    assert gate["by"] == "controller" and "gate for n2: pass" in str(gate["why"])
    assert events_cli("--state-dir", str(state), "--node", "n1") == []
    assert events_cli("--state-dir", str(state), "--since", "2099-01-01T00:00") == []
    recent = events_cli("--state-dir", str(state), "--since", "1h")
    # The last hour holds n2's story and the controller's own start (the Slurm features it found: no node).
    assert [e for e in recent if e.get("node") == "n2"] == got
    assert [e["kind"] for e in recent if e.get("node") != "n2"] == ["slurm_features"]
    text = CliRunner().invoke(cli, ["events", "--state-dir", str(state)])
    assert text.exit_code == 0 and "n2" in text.output and "mark" in text.output and "by agent" in text.output


def node(name: str, states: set[str], reason: str = "", at: int | None = None) -> Node:
    return Node(name, "", "", frozenset(states), reason=reason, reason_changed_at=at, reason_set_by="root")


def test_a_mark_is_recorded_once_and_its_lifting_outside_the_controller_too(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    nodes = [node("n3", {"IDLE", "FAIL"}, agent_reason_text(), 100), node("n4", {"IDLE", "DRAIN"}, "fan", 90)]
    marked = [look(n, ControllerSettings()) for n in nodes]
    seen = log.note_reasons({}, marked)
    seen = log.note_reasons(seen, marked)  # the same reason again: nothing new
    seen = log.note_reasons(seen, [])  # the agent lifted its mark
    assert [(e["kind"], e["node"], e["by"]) for e in log.read()] == [
        ("mark", "n3", "agent"),
        ("back_in_service", "n3", "agent or operator"),
    ]
    # A restarted controller knows the marks still out and records them no second time.
    log.note_reasons(seen, marked)
    assert EventLog(tmp_path).last_marks() == {"n3": (agent_reason_text(), 100)}


def agent_reason_text() -> str:
    from hpresilience.reasons import Action

    return agent_reason(Action.REBOOT, "xid: XID 79")


def test_events_rotate_past_their_size_and_are_read_across_the_rotation(tmp_path: Path) -> None:
    log = EventLog(tmp_path, max_bytes=300)
    for i in range(10):
        log.record("mark", f"n{i}", "agent", "x" * 50)
    assert (tmp_path / "events.jsonl.1").exists() and (tmp_path / "events.jsonl").stat().st_size < 600
    names = [e["node"] for e in log.read()]
    assert names == sorted(names, key=lambda n: int(n[1:])) and names[-1] == "n9"


@pytest.mark.parametrize("text", ["yesterday", "5y", ""])
def test_since_names_what_it_accepts(text: str) -> None:
    with pytest.raises(ConfigError, match="duration"):
        parse_since(text)


def test_since_reads_durations_iso_times_and_epochs() -> None:
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("1700000000") == 1_700_000_000.0
    assert parse_since("2026-11-25T16:00:00+00:00") == 1795622400.0


def test_events_without_a_record_say_where_they_looked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hpresilience.cli import main

    assert main(["events", "--state-dir", str(tmp_path)]) == 1
    assert f"no event record in {tmp_path}" in capsys.readouterr().err
