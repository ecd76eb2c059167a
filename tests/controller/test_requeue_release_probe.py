"""The controller's requeue release thread, behind a probe of Slurm's own release (issue 23, item 3).

Slurm holds a requeued job cred_expire + 1 s (two minutes) on 22.05, 24.11 and 26.05 by default, so the controller
starts jobs the wrapper requeued. Where the site set SchedulerParameters=requeue_delay=N on 25.11+ and N is no
longer than the release interval, Slurm starts them as soon as we would: the thread is not needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.controller.loop import Controller
from hpresilience.controller.settings import ControllerSettings
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.fakerunner import FakeRunner
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"


def controller(tmp_path: Path, version: str, config: str, every_s: float = 2.0) -> Controller:
    runner = FakeRunner(version).answer("scontrol", "show", "config", stdout=(SLURM / config).read_text())
    settings = ControllerSettings.model_validate(
        {"state_dir": str(tmp_path / "ctl"), "metrics_address": "", "release_requeued_every_s": every_s}
    )
    return Controller(settings, SlurmClient(runner))


@pytest.mark.parametrize(
    ("version", "config", "every_s", "left_to_slurm"),
    [
        ("26.05.5", "show_config_requeue_delay_26.05.txt", 2.0, 2),
        ("26.05.5", "show_config_requeue_delay_26.05.txt", 1.0, None),  # Slurm would be slower than us
        ("24.11.5", "show_config_requeue_delay_24.11.txt", 2.0, None),  # 24.11 ignores requeue_delay
        ("26.05.5", "show_config_26.05.txt", 2.0, None),
    ],
)
def test_release_thread_is_left_out_only_where_slurm_releases_as_fast(
    tmp_path: Path, version: str, config: str, every_s: float, left_to_slurm: int | None
) -> None:
    assert controller(tmp_path, version, config, every_s).slurm_releases_requeued_jobs() == left_to_slurm


def test_an_unreadable_probe_keeps_the_release_thread(tmp_path: Path) -> None:
    runner = FakeRunner("26.05.5").answer(
        "scontrol", "show", "config", exit_code=1, stderr="slurm_load_ctl_conf error: Access/permission denied"
    )
    settings = ControllerSettings.model_validate({"state_dir": str(tmp_path / "ctl"), "metrics_address": ""})
    assert Controller(settings, SlurmClient(runner)).slurm_releases_requeued_jobs() is None
