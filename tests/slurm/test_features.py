"""Slurm's own resilience features read from `scontrol --version` and `scontrol show config` (issue 35, point 4):
recorded on 26.05.5 with them turned on (tests/fixtures/slurm/record_features.sh), and on 22.05, 24.11 and 26.05
as the devcluster ran them before. A feature counts only on a release that has it."""

from __future__ import annotations

import pytest

from hpresilience.slurm import parse
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.features import SlurmFeatures, job_requeue_expedited, parse_features
from hpresilience.testing.fakerunner import FakeRunner
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"


def config(name: str) -> dict[str, str]:
    return parse.parse_key_values((SLURM / name).read_text())


def test_26_05_with_the_features_turned_on_reads_every_one_of_them() -> None:
    conf = config("show_config_features_26.05.txt") | {"MetricsType": "metrics/openmetrics"}
    f = parse_features((26, 5, 5), conf)
    assert f == SlurmFeatures(
        version="26.05.5",
        expedited_requeue=True,
        requeue_delay_s=None,
        health_check_reboot_only=True,
        reboot_force=True,
        metrics_endpoint=True,
    )
    assert f.names() == ["expedited_requeue", "health_check_reboot_only", "reboot_force", "metrics_endpoint"]


@pytest.mark.parametrize(
    ("version", "fixture"),
    [((22, 5, 8), "show_config_22.05.txt"), ((24, 11, 5), "show_config_24.11.txt")],
)
def test_22_05_and_24_11_have_none_of_them(version: tuple[int, int, int], fixture: str) -> None:
    f = parse_features(version, config(fixture))
    assert f.names() == [] and not f.expedited_requeue and f.requeue_delay_s is None


def test_a_setting_counts_only_on_a_release_that_honours_it() -> None:
    """The 26.05 settings read as if 24.11 printed them (24.11 accepts requeue_delay and ignores it)."""
    conf = config("show_config_features_26.05.txt") | {
        "SchedulerParameters": "requeue_delay=2",
        "MetricsType": "metrics/openmetrics",
    }
    assert parse_features((24, 11, 5), conf).names() == []
    assert parse_features((25, 11, 0), conf).names() == ["expedited_requeue", "metrics_endpoint", "requeue_delay=2s"]


def test_26_05_without_the_settings_has_only_what_needs_none() -> None:
    f = parse_features((26, 5, 5), config("show_config_26.05.txt"))
    assert not f.expedited_requeue and not f.health_check_reboot_only and f.reboot_force


def test_metrics_count_only_with_the_openmetrics_plugin_and_http_on() -> None:
    """26.05.5 without MetricsType lists /metrics/... and answers each with nothing (the recorded config)."""
    conf = config("show_config_features_26.05.txt")
    assert not parse_features((26, 5, 5), conf).metrics_endpoint
    conf |= {"MetricsType": "metrics/openmetrics"}
    assert parse_features((26, 5, 5), conf).metrics_endpoint
    conf |= {"CommunicationParameters": "block_null_hash,disable_http"}
    assert not parse_features((26, 5, 5), conf).metrics_endpoint


@pytest.mark.parametrize(
    ("fixture", "expedited"),
    [
        ("show_job_expedited_26.05.txt", True),
        ("show_job_oneliner_26.05.txt", False),
        ("show_job_oneliner_24.11.txt", False),
        ("show_job_oneliner_22.05.txt", False),
    ],
)
def test_a_job_submitted_with_requeue_expedite_says_so_in_its_record(fixture: str, expedited: bool) -> None:
    first = (SLURM / fixture).read_text().splitlines()[0]
    assert job_requeue_expedited(parse.parse_oneliner(first)) is expedited


def test_the_probe_reads_the_version_and_the_config_once_each() -> None:
    runner = FakeRunner("26.05.5").answer(
        "scontrol", "show", "config", stdout=(SLURM / "show_config_features_26.05.txt").read_text()
    )
    assert SlurmClient(runner).features().expedited_requeue
    assert [str(c) for c in runner.calls] == ["scontrol --version", "scontrol show config"]


def test_features_come_back_from_the_state_file_and_wrong_types_count_as_absent() -> None:
    f = parse_features((26, 5, 5), config("show_config_features_26.05.txt"))
    assert SlurmFeatures.from_json(f.to_json()) == f
    bad = SlurmFeatures.from_json({"version": 26, "expedited_requeue": "yes", "requeue_delay_s": True, "x": 1})
    assert bad == SlurmFeatures()
