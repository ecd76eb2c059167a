"""The controller probes Slurm's own resilience features once at start (issue 35, point 4) and says what it found:
in its log, in `hpresilience events` and in `hpresilience status`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from hpresilience.cli import main
from hpresilience.controller.loop import Controller
from hpresilience.controller.settings import ControllerSettings
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.fakerunner import FakeRunner
from hpresilience.testing.slurmroot import SlurmRelease
from tests.conftest import FIXTURES
from tests.controller.conftest import Scripts, settings_for, wait_until

SLURM = FIXTURES / "slurm"


def controller(tmp_path: Path, runner: FakeRunner) -> Controller:
    settings = ControllerSettings.model_validate({"state_dir": str(tmp_path / "ctl"), "metrics_address": ""})
    return Controller(settings, SlurmClient(runner))


def test_the_features_found_at_start_show_in_status_and_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = FakeRunner("26.05.5").answer(
        "scontrol", "show", "config", stdout=(SLURM / "show_config_features_26.05.txt").read_text()
    )
    ctl = controller(tmp_path, runner)
    ctl._say_features(ctl.probe_slurm_features())
    # The release thread's own probe reuses what was found: the config is read once.
    assert ctl.slurm_releases_requeued_jobs() is None
    assert [str(c) for c in runner.calls].count("scontrol show config") == 1
    (tmp_path / "ctl" / "nodes").mkdir()
    assert main(["status", "--state-dir", str(tmp_path / "ctl")]) == 0
    out = capsys.readouterr().out
    assert "slurm 26.05.5: expedited_requeue, health_check_reboot_only, reboot_force\n" in out
    events = [json.loads(line) for line in (tmp_path / "ctl" / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["slurm_features"]
    assert events[0]["expedited_requeue"] is True and events[0]["version"] == "26.05.5"


def test_a_release_without_them_says_so_and_an_unreadable_probe_says_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = FakeRunner("22.05.8").answer(
        "scontrol", "show", "config", stdout=(SLURM / "show_config_22.05.txt").read_text()
    )
    ctl = controller(tmp_path, runner)
    ctl._say_features(ctl.probe_slurm_features())
    (tmp_path / "ctl" / "nodes").mkdir()
    assert main(["status", "--state-dir", str(tmp_path / "ctl")]) == 0
    assert "slurm 22.05.8: no features of its own" in capsys.readouterr().out
    failing = FakeRunner("26.05.5").answer("scontrol", "show", "config", exit_code=1, stderr="Access denied")
    other = controller(tmp_path / "other", failing)
    assert other.probe_slurm_features() is None
    other._say_features(None)
    assert not (tmp_path / "other" / "ctl" / "slurm_features.json").exists()


@pytest.mark.integration
def test_the_controller_says_what_the_running_release_offers(
    cluster: DevCluster,
    slurm: SlurmClient,
    scripts: Scripts,
    tmp_path: Path,
    start_controller: Callable[[Controller], Controller],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On the real cluster of each release: its version, and expedited requeue only on 26.05 (the devcluster turns
    it on there; 22.05 and 24.11 have none)."""
    start_controller(Controller(settings_for(scripts, tmp_path / "state"), slurm))
    path = tmp_path / "state" / "slurm_features.json"
    found = wait_until(lambda: path.exists() and json.loads(path.read_text()), "the controller's probe")
    assert found["version"].startswith(cluster.release.value)
    assert found["expedited_requeue"] is (cluster.release is SlurmRelease.V26_05)
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    assert f"slurm {found['version']}: " in capsys.readouterr().out
