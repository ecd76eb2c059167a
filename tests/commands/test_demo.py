"""The README's main command, end to end: `hpresilience demo` tells the whole story and cleans up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpresilience.testing.devcluster import DevCluster
from tests.conftest import TEST_BASE_PORT, require_slurm

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_runs_the_whole_story_and_leaves_nothing_behind(tmp_path: Path) -> None:
    require_slurm()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"devcluster: {{base_port: {TEST_BASE_PORT + 400}}}\n")
    state = tmp_path / "cluster"
    env = {**os.environ, "HPRESILIENCE_DEVCLUSTER_DIR": str(state)}
    res = subprocess.run(
        [sys.executable, "-m", "hpresilience", "--config", str(cfg), "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr[-3000:]
    assert "FAULT INJECTED" in out
    victim = re.search(r"kernel log", out) and re.search(r"in (n\d)'s kernel log", out)
    assert victim is not None
    node = victim.group(1)
    # The agent marked it, the wrapper swapped in the spare, the controller repaired it, training finished.
    assert re.search(rf"slurm: {node} is allocated\+fail reason='Action:\w+ \[hpr-agent\] xid: XID 79", out)
    assert "node_swapped" in out and "source': 'hot_spare'" in out
    assert re.search(rf"slurm: {node} is idle\+drain reason='Action:\w+ \[hpr-controller\] repairing", out)
    assert re.search(rf"slurm: {node} is idle$", out, re.M)
    assert re.search(r"COMPLETED: training finished step=60 ", out)
    for label in (
        "node FAIL in Slurm (agent)",
        "step relaunched and running (wrapper)",
        "repaired and back idle (controller)",
        "training finished",
    ):
        assert re.search(re.escape(label) + r"\s+\d+\.\d+ s", out), label
    assert not state.exists()
    assert DevCluster(state).processes() == []


DEMO = [sys.executable, "-m", "hpresilience"]


def test_demo_scenario_nan_ends_with_its_one_line_and_exit_code_zero(tmp_path: Path) -> None:
    require_slurm()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"devcluster: {{base_port: {TEST_BASE_PORT + 450}}}\n")
    env = {**os.environ, "HPRESILIENCE_DEVCLUSTER_DIR": str(tmp_path / "cluster")}
    res = subprocess.run(
        [sys.executable, "-m", "hpresilience", "--config", str(cfg), "demo", "--scenario", "nan"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "scenario nan: ok rolled_back_to=20 skipped=22-23 completed=yes" in res.stdout.splitlines()
    assert not (tmp_path / "cluster").exists()


def test_demo_crash_loop_scenario_stops_after_the_bound_with_no_node_marked(tmp_path: Path) -> None:
    """Issue 34: `hpresilience demo --scenario crash-loop` ends with its one line and cleans up."""
    require_slurm()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"devcluster: {{base_port: {TEST_BASE_PORT + 600}}}\n")
    state = tmp_path / "cluster"
    env = {**os.environ, "HPRESILIENCE_DEVCLUSTER_DIR": str(state)}
    res = subprocess.run(
        [*DEMO, "--config", str(cfg), "demo", "--scenario", "crash-loop", "--timeout", "200"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr[-3000:]
    assert re.search(r"^scenario crash-loop: ok stopped_after=3 nodes_marked=0$", out, re.M), out[-3000:]
    assert "step_moved_off_crash" in out
    assert not state.exists()
    assert DevCluster(state).processes() == []


@pytest.mark.timeout(700)  # three training jobs on the local cluster: ~2 min here, more on a loaded machine
def test_the_checkpointless_scenario_ends_with_its_ok_line_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """`hpresilience demo --scenario checkpointless` (issue 33): two node faults recovered in-process, no survivor
    restarted, no step computed twice, the fault-free run's weights; the relaunch path's figure beside it."""
    require_slurm()
    pytest.importorskip("torch")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"devcluster: {{base_port: {TEST_BASE_PORT + 400}}}\n")
    state = tmp_path / "cluster"
    env = {**os.environ, "HPRESILIENCE_DEVCLUSTER_DIR": str(state)}
    res = subprocess.run(
        [*DEMO, "--config", str(cfg), "demo", "--scenario", "checkpointless"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr[-3000:]
    assert re.search(
        r"^scenario checkpointless: ok faults=2 survivors_restarted=0 steps_recomputed=0 "
        r"max_recovery_s=\d+\.\d\d restart_path_s=\d+\.\d\d weights_equal=yes$",
        out,
        re.M,
    ), out[-3000:]
    assert not state.exists()
    assert DevCluster(state).processes() == []
