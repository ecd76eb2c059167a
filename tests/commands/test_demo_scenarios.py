"""`hpresilience demo --scenario nan|crash-loop`: each ends with its one line and cleans up (a file of its own so that
the demos run on separate test workers)."""

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
