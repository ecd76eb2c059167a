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
