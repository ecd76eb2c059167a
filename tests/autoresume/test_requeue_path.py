"""Which path a requeue of the wrapper's job takes (issue 35, point 4): Slurm's own expedited requeue where the job
asked for it and the cluster has it (25.11+), else the controller's release through the marker (22.05, 24.11)."""

from __future__ import annotations

from pathlib import Path

from hpresilience.autoresume.decide.requeue import VIA_CONTROLLER, VIA_SLURM, choose_requeue_path, prepare_requeue
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.slurm import parse
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.fakerunner import FakeRunner
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"


def details(fixture: str) -> dict[str, str]:
    return parse.parse_oneliner((SLURM / fixture).read_text().splitlines()[0])


def runner_with_config(version: str, fixture: str) -> FakeRunner:
    return FakeRunner(version).answer("scontrol", "show", "config", stdout=(SLURM / fixture).read_text())


def test_an_expedited_job_on_a_cluster_that_allows_it_is_left_to_slurm() -> None:
    path = choose_requeue_path(
        SlurmClient(runner_with_config("26.05.5", "show_config_features_26.05.txt")),
        details("show_job_expedited_26.05.txt"),
    )
    assert path.expedited and path.via == VIA_SLURM
    assert path.fields()["requeue_via"] == VIA_SLURM and "expedited_requeue" in path.fields()["slurm_features"]  # type: ignore[operator]


def test_an_expedited_job_where_the_cluster_does_not_allow_it_keeps_the_controllers_path() -> None:
    path = choose_requeue_path(
        SlurmClient(runner_with_config("26.05.5", "show_config_26.05.txt")), details("show_job_expedited_26.05.txt")
    )
    assert not path.expedited and path.via == VIA_CONTROLLER and path.features is not None


def test_a_job_that_did_not_ask_costs_no_probe_and_keeps_the_controllers_path() -> None:
    runner = FakeRunner("22.05.8")
    path = choose_requeue_path(SlurmClient(runner), details("show_job_oneliner_22.05.txt"))
    assert path.via == VIA_CONTROLLER and path.fields() == {"requeue_via": VIA_CONTROLLER, "slurm_features": None}
    assert runner.calls == []


def test_an_unreadable_probe_keeps_the_controllers_path() -> None:
    runner = FakeRunner("26.05.5").answer("scontrol", "show", "config", exit_code=1, stderr="Access denied")
    assert choose_requeue_path(SlurmClient(runner), details("show_job_expedited_26.05.txt")).via == VIA_CONTROLLER


def test_the_marker_is_set_only_for_the_controllers_path(tmp_path: Path) -> None:
    reporter = Reporter(WrapperStateStore(tmp_path, 7), 7, None)
    runner = FakeRunner("26.05.5").answer("squeue", "-h", "-j", "7", stdout="exp7\n").answer("scontrol", "update")
    client = SlurmClient(runner)
    expedited = choose_requeue_path(
        SlurmClient(runner_with_config("26.05.5", "show_config_features_26.05.txt")),
        details("show_job_expedited_26.05.txt"),
    )
    prepare_requeue(client, 7, reporter, expedited)
    assert runner.calls == []
    prepare_requeue(client, 7, reporter, choose_requeue_path(client, {}))
    assert [str(c) for c in runner.calls][-1] == "scontrol update jobid=7 Comment=exp7 hpr:requeued"
