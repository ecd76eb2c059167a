"""Integration: one agent per devcluster node, each reading its own recorded-hardware root.

Faults are injected into a node's inputs the way the hardware would show them (an `NVRM: Xid` line in
its kernel log, a GPU gone from NVML) and the test watches what the real Slurm cluster shows.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.fakenode import FakeNode

pytestmark = pytest.mark.integration


class Agents:
    def __init__(self, cluster: DevCluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.nodes: dict[str, FakeNode] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, **agent_settings: object) -> None:
        for name in self.cluster.names():
            node = FakeNode.make(self.root / name, "p5.48xlarge")
            cfg = yaml.safe_load((node.root / "config.yaml").read_text())
            cfg["logging"] = {"level": "debug", "json": True}
            cfg["agent"] = {
                "node_name": name,
                "passive_interval_s": 1.0,
                "metrics_address": "",
                "state_dir": str(node.root / "agent"),
                "active_checks": False,
                **agent_settings,
            }
            (node.root / "agent.yaml").write_text(yaml.safe_dump(cfg))
            log = open(node.root / "agent.log", "wb")  # noqa: SIM115 - closed with the process
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "hpresilience", "--config", str(node.root / "agent.yaml"), "agent"],
                env=self.cluster.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self.nodes[name] = node
        self.wait_cycles(1)

    def wait_cycles(self, n: int, timeout: float = 30.0) -> None:
        """Until every agent has logged at least n more finished cycles (decisions) than now."""

        def count(name: str) -> int:
            return (self.nodes[name].root / "agent.log").read_text(errors="replace").count('"check_cycle_finished"')

        start = {n: count(n) for n in self.nodes}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                assert p.poll() is None, f"agent on {name} exited: " + (self.nodes[name].root / "agent.log").read_text()
            if all(count(name) >= start[name] + n for name in self.nodes):
                return
            time.sleep(0.2)

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture()
def agents(cluster: DevCluster, tmp_path: Path) -> Iterator[Agents]:
    a = Agents(cluster, tmp_path)
    yield a
    a.stop()


def wait_state(slurm: SlurmClient, name: str, flag: str, timeout: float = 20.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if slurm.node(name).has(flag):
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{name} not {flag} after {timeout} s: {slurm.node(name)}")


def test_fatal_xid_fails_only_that_node(agents: Agents, slurm: SlurmClient) -> None:
    agents.start()
    agents.nodes["n2"].inject("xid:79:3")
    took = wait_state(slurm, "n2", "FAIL")
    n2 = slurm.node("n2")
    assert n2.reason.startswith("Action:") and "[hpr-agent]" in n2.reason and "XID 79" in n2.reason
    assert took < 10
    agents.wait_cycles(2)
    assert all(slurm.node(n).is_idle for n in ("n1", "n3", "n4"))


def test_operator_drained_node_keeps_its_reason(agents: Agents, slurm: SlurmClient) -> None:
    slurm.set_node_state(["n3"], "drain", "operator: bad fan")
    agents.start()
    agents.nodes["n3"].inject("xid:79:0")
    agents.wait_cycles(3)
    n3 = slurm.node("n3")
    assert n3.reason == "operator: bad fan" and n3.has("DRAIN") and not n3.has("FAIL")


def test_application_xids_change_no_node_state(agents: Agents, slurm: SlurmClient) -> None:
    agents.start()
    for code in (13, 31, 43):
        agents.nodes["n1"].inject(f"xid:{code}:0")
    agents.wait_cycles(3)
    assert all(n.is_idle and not n.reason for n in slurm.nodes())


def test_check_failing_everywhere_fails_no_more_than_the_ceiling(agents: Agents, slurm: SlurmClient) -> None:
    """A GPU missing on all 4 nodes (a bad profile, say): the 10 % ceiling with its floor of 1 allows one node."""
    agents.start()
    for node in agents.nodes.values():
        node.inject("gpu_missing")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(n.has("FAIL") for n in slurm.nodes()):
        time.sleep(0.2)
    agents.wait_cycles(4)
    failed = [n.name for n in slurm.nodes() if n.has("FAIL")]
    assert len(failed) == 1, failed
    logs = "".join((n.root / "agent.log").read_text() for n in agents.nodes.values())
    assert "fleet ceiling reached" in logs
    # Agents stand down, they do not drain: the held nodes stay in service.
    assert sum(1 for n in slurm.nodes() if n.is_idle) == 3


def test_agent_runs_its_checks_when_its_metrics_port_is_taken(agents: Agents) -> None:
    """Issue 14 item 7: the agent used to die at start on a bind failure (a crash loop under systemd)."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        agents.start(metrics_address=f"127.0.0.1:{holder.getsockname()[1]}")
        agents.wait_cycles(2)  # asserts every agent process is still alive meanwhile
    for node in agents.nodes.values():
        assert '"metrics_server_not_started"' in (node.root / "agent.log").read_text(errors="replace")
