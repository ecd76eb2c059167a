"""What the agent asks slurmctld, counted through the command runner on the real devcluster.

Every node runs an agent, so a healthy cycle must ask Slurm nothing, and what it does ask must not grow with
the cluster: its own node by name, and the fleet ceiling's view (its partition by reason) only for a mark.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.agent.collector import HealthCollector
from hpresilience.agent.daemon import Agent
from hpresilience.agent.settings import AgentSettings
from hpresilience.config import load_config
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.runner import CountingRunner
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.fakenode import FakeNode
from tests.conftest import node_read

pytestmark = pytest.mark.integration
FULL_TABLE = ("sinfo --json", "squeue --json")


def make_agent(
    cl: DevCluster, root: Path, name: str = "n1", **settings: object
) -> tuple[Agent, CountingRunner, FakeNode]:
    node = FakeNode.make(root / name, "p5.48xlarge")
    collector = HealthCollector(load_config(node.root / "config.yaml").health, sources=[])
    runner = CountingRunner.like(cl.client().runner)
    opts = {
        "node_name": name,
        "state_dir": str(root / "agent"),
        "metrics_address": "",
        "active_checks": False,
        "required_repeats": 1,
        **settings,
    }
    client = SlurmClient(runner)
    assert client.version  # probed once per process (`scontrol --version`), not per cycle
    runner.calls.clear()
    return Agent(AgentSettings(**opts), client, collector), runner, node  # type: ignore[arg-type]


def assert_sized_by_node(commands: list[str]) -> None:
    for c in commands:
        assert not c.startswith(FULL_TABLE), c
        assert c not in ("scontrol show node", "scontrol show node -o", "scontrol --json show node"), c


def test_healthy_cycle_runs_no_slurm_command(cluster: DevCluster, tmp_path: Path) -> None:
    """After one look at its own node (is a mark of ours on it?), healthy cycles ask Slurm nothing."""
    agent, runner, _ = make_agent(cluster, tmp_path)
    assert agent.cycle().kind == "none"
    assert runner.commands() == [node_read(cluster, "n1")]
    runner.calls.clear()
    for _ in range(5):
        assert agent.cycle().kind == "none"
    assert runner.calls == []
    # A restarted agent remembers that it has no mark out: still nothing to ask.
    again, runner2, _ = make_agent(cluster, tmp_path)
    again.cycle()
    assert runner2.calls == []


def test_busy_node_is_looked_at_again_only_at_the_active_interval(
    cluster: DevCluster, tmp_path: Path, slurm: SlurmClient
) -> None:
    """Active checks are due but the node runs a job: one look at its own node, then none until the
    active-check interval has passed again."""
    job = slurm.sbatch("-w", "n1", "-o", "/dev/null", "--wrap", "sleep 60")
    slurm.wait_running(job)
    agent, runner, _ = make_agent(cluster, tmp_path, active_checks=True, active_interval_s=3600)
    agent.memory.marked = False
    agent.cycle()
    assert runner.commands() == [node_read(cluster, "n1")] and agent.last_active == 0.0  # never ran
    runner.calls.clear()
    for _ in range(3):
        agent.cycle()
    assert runner.calls == []
    agent.last_active_look -= 3600
    agent.cycle()
    assert runner.commands() == [node_read(cluster, "n1")]


def test_fault_reads_own_node_then_the_ceiling_view_then_marks(
    cluster: DevCluster, tmp_path: Path, slurm: SlurmClient
) -> None:
    """A confirmed fault reads this node, then the ceiling's view (its partition grouped by reason, not the
    whole table), marks, and checks the ceiling again; once clear the agent lifts its own mark and goes quiet."""
    agent, runner, node = make_agent(cluster, tmp_path, name="n2")
    agent.memory.marked = False
    node.inject("xid:79:0")
    d = agent.cycle()
    assert d.kind == "mark" and slurm.node("n2").has("FAIL")
    cmds = runner.commands()
    assert cmds[0] == node_read(cluster, "n2")
    assert cmds.count("sinfo -h --partition=debug -o %R|%D|%H|%N|%E") == 2
    assert any(c.startswith("scontrol update nodename=n2 state=FAIL") for c in cmds)
    assert_sized_by_node(cmds)
    node.heal()
    runner.calls.clear()
    assert agent.cycle().kind == "resume" and not slurm.node("n2").has("FAIL")
    assert runner.commands()[0] == node_read(cluster, "n2")
    runner.calls.clear()
    agent.cycle()
    assert runner.calls == []


def test_a_corrupt_state_file_is_logged_and_the_agent_starts_afresh(cluster: DevCluster, tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    agent, _, _ = make_agent(cluster, tmp_path)
    agent.cycle()
    agent.state_path.write_text("{not json")
    with capture_logs() as logs:
        again, _, _ = make_agent(cluster, tmp_path)
    warned = [e for e in logs if e["event"] == "agent_state_unreadable"]
    assert warned and warned[0]["log_level"] == "warning" and str(again.state_path) == warned[0]["path"]
    assert again.memory.streaks == {} and again.memory.marked is None


def test_a_mark_past_the_fleet_ceiling_is_held_on_the_real_cluster(
    cluster: DevCluster, tmp_path: Path, slurm: SlurmClient
) -> None:
    """4 nodes, ceiling max(1, 10 %) = 1: with n3 under repair by the controller, n2's confirmed fault is held
    (logged, counted) and n2 stays in service; with n3 back, the same fault marks n2."""
    from structlog.testing import capture_logs

    slurm.set_node_state(["n3"], "drain", "[hpr-controller] repairing: reboot (attempt 1) via reboot")
    agent, _, node = make_agent(cluster, tmp_path, name="n2")
    node.inject("xid:79:0")
    with capture_logs() as logs:
        d = agent.cycle()
    assert d.kind == "hold" and d.held_by_ceiling and "n3" in d.why and "ceiling 1 of 4" in d.why
    assert not slurm.node("n2").is_unavailable
    assert [e for e in logs if e["event"] == "node_mark_held_ceiling" and e["log_level"] == "warning"]
    assert d.action is not None
    assert agent.registry.get_sample_value("hpr_agent_ceiling_holds_total", {"action": d.action.reason_word}) == 1
    slurm.set_node_state(["n3"], "resume")
    assert agent.cycle().kind == "mark" and slurm.node("n2").has("FAIL")


def test_two_agents_marking_at_once_keep_only_what_the_ceiling_allows(
    cluster: DevCluster, tmp_path: Path, slurm: SlurmClient
) -> None:
    """Both pass the ceiling before either marked (as when a fault hits the fleet in the same second): after
    marking, the later one in (reason time, name) order backs out, so one node is out, not two."""
    a, _, na = make_agent(cluster, tmp_path / "a", name="n1")
    b, _, nb = make_agent(cluster, tmp_path / "b", name="n2")
    for n in (na, nb):
        n.inject("xid:79:0")
    # b marks first but its view was read before a's mark: simulate by marking a by hand in the same second.
    slurm.set_node_state(["n1"], "fail", "Action:Replace [hpr-agent] xid: seen at once")
    a.memory.marked = True
    d = b.cycle()
    assert d.kind == "hold" and d.held_by_ceiling
    assert not slurm.node("n2").is_unavailable and slurm.node("n1").has("FAIL")
