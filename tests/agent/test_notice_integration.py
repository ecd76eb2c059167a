"""Integration: a spot reclaim announced by the fake metadata server reaches Slurm, the ranks and the controller.

One agent cycle on n2 (`hpresilience agent --once`, as Slurm's HealthCheckProgram runs it) against the real
devcluster and a fake IMDSv2 server over real HTTP: the node ends DRAIN with the Planned reason, the notice
file appears and check_alive() (with its ownership check) turns False, and the controller's cycles start no
repair of the node.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hpresilience.controller.loop import Controller
from hpresilience.reasons import PlannedKind, parse_planned
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.fakeimds import FakeImds
from hpresilience.testing.fakenode import FakeNode
from hpresilience.torch.preemption import PreemptionWatcher
from hpresilience.torch.settings import PreemptionConfig
from tests.controller.conftest import settings_for, write_scripts

pytestmark = pytest.mark.integration


def agent_argv(node: FakeNode, name: str, imds_url: str, notice: Path, **agent: object) -> list[str]:
    cfg = yaml.safe_load((node.root / "config.yaml").read_text())
    cfg["agent"] = {
        "node_name": name,
        "metrics_address": "",
        "state_dir": str(node.root / "agent"),
        "active_checks": False,
        **agent,
        "notices": {"ec2_endpoint": imds_url, "notice_file": str(notice), "poll_interval_s": 0.5},
    }
    (node.root / "agent.yaml").write_text(yaml.safe_dump(cfg))
    return [sys.executable, "-m", "hpresilience", "--config", str(node.root / "agent.yaml"), "agent"]


def agent_once(cluster: DevCluster, node: FakeNode, name: str, imds_url: str, notice: Path) -> str:
    res = subprocess.run(
        [*agent_argv(node, name, imds_url, notice), "--once"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stderr


def test_spot_reclaim_drains_the_node_tells_the_ranks_and_is_not_repaired(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    node = FakeNode.make(tmp_path / "n2", "p5.48xlarge")
    notice = tmp_path / "run" / "notice.json"
    ranks = PreemptionWatcher(PreemptionConfig(notice_file=str(notice), signals=())).start()
    try:
        with FakeImds() as imds:
            assert "node_drained_planned" not in agent_once(cluster, node, "n2", imds.url, notice)
            assert slurm.node("n2").is_idle and ranks.alive()  # nothing announced: nothing done
            imds.announce_spot("terminate", in_s=120)
            announced = time.time()
            log = agent_once(cluster, node, "n2", imds.url, notice)
        assert "node_drained_planned" in log and "node_notice_written" in log
        n2 = slurm.node("n2")
        planned = parse_planned(n2.reason)
        assert n2.has("DRAIN") and planned is not None, n2
        assert planned.kind is PlannedKind.RECLAIM and abs(planned.deadline - (announced + 120)) < 3
        assert not n2.has("FAIL") and not n2.reason.startswith("Action:")  # planned, not a fault
        assert notice.stat().st_uid == 0 and not ranks.alive() and "notice file" in (ranks.reason or "")
        assert all(slurm.node(n).is_idle for n in ("n1", "n3", "n4"))

        scripts = write_scripts(tmp_path / "scripts", cluster)
        ctl = Controller(settings_for(scripts, tmp_path / "ctl"), slurm)
        ctl.cycle()
        ctl.cycle()
        assert ctl.records == {} and scripts.calls == []
        assert slurm.node("n2").reason == n2.reason and slurm.node("n2").has("DRAIN")
    finally:
        ranks.stop()


def test_the_daemon_drains_within_seconds_of_a_reclaim_between_its_check_cycles(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """The agent daemon checks every 60 s; a reclaim announced after its first cycle is acted on at the next
    notice poll (0.5 s here, 5 s by default), not a minute later."""
    node = FakeNode.make(tmp_path / "n3", "p5.48xlarge")
    notice = tmp_path / "run" / "notice.json"
    with FakeImds() as imds:
        log = open(node.root / "agent.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            agent_argv(node, "n3", imds.url, notice, passive_interval_s=60.0),
            env=cluster.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while b"notice_source_on" not in (node.root / "agent.log").read_bytes():  # its first cycle
                assert proc.poll() is None and time.monotonic() < deadline, (node.root / "agent.log").read_text()
                time.sleep(0.1)
            imds.announce_spot("terminate", in_s=120)
            announced = time.monotonic()
            while not slurm.node("n3").has("DRAIN"):
                assert time.monotonic() - announced < 10, (node.root / "agent.log").read_text()
                time.sleep(0.1)
            took = time.monotonic() - announced
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            log.close()
    assert took < 5 and parse_planned(slurm.node("n3").reason) is not None and notice.exists()
