"""`hpresilience demo --scenario checkpointless` (issue 33): a file of its own, the longest demo (three jobs)."""

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
