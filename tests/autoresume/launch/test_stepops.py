"""StepOps.reap: a node whose reap task did not report back is asked again within the bound."""

from __future__ import annotations

import json
from pathlib import Path

from hpresilience.autoresume.launch.stepops import StepOps
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.fakerunner import FakeRunner

JOB = 4242


def _events(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp_path / f"{JOB}.events.jsonl").read_text().splitlines()]


def _ops(tmp_path: Path, runner: FakeRunner) -> StepOps:
    return StepOps(SlurmClient(runner), JOB, {}, Reporter(WrapperStateStore(tmp_path, JOB), JOB, None), 10.0)


def test_a_node_whose_reap_task_failed_at_once_is_reaped_on_the_second_try(tmp_path: Path) -> None:
    runner = FakeRunner()
    runner.answer(
        "srun",
        exit_code=1,
        stderr="srun: error: Unable to create step for job 4242: Job/step already completing or completed\n",
    )
    runner.answer("srun", stdout="hpr-stale n1 39 bash -c orphan\nhpr-reaped n1\n")
    _ops(tmp_path, runner).reap(["n1"])
    assert [c.argv[0] for c in runner.calls if c.argv[0] == "srun"] == ["srun", "srun"]
    events = _events(tmp_path)
    assert [(e["node"], e["pid"]) for e in events if e["event"] == "stale_task_killed"] == [("n1", 39)]
    (checked,) = [e for e in events if e["event"] == "old_tasks_checked"]
    assert checked["killed"] == 1 and checked.get("unchecked") is None


def test_the_second_try_asks_only_the_nodes_that_did_not_report(tmp_path: Path) -> None:
    runner = FakeRunner()
    runner.answer("srun", stdout="hpr-reaped n1\n")
    runner.answer("srun", stdout="hpr-reaped n2\n")
    _ops(tmp_path, runner).reap(["n1", "n2"])
    sruns = [c.argv for c in runner.calls if c.argv[0] == "srun"]
    assert len(sruns) == 2 and "--nodelist=n1,n2" in sruns[0] and "--nodelist=n2" in sruns[1]


def test_a_node_that_never_reports_is_named_unchecked_after_the_last_try(tmp_path: Path) -> None:
    runner = FakeRunner()
    runner.answer("srun", exit_code=1, stderr="srun: error: Node n2 not responding\n")
    _ops(tmp_path, runner).reap(["n2"])
    assert len([c for c in runner.calls if c.argv[0] == "srun"]) == 3
    (checked,) = [e for e in _events(tmp_path) if e["event"] == "old_tasks_checked"]
    assert checked["unchecked"] == "n2" and checked["killed"] == 0
