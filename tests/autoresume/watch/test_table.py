"""The detector table: a watch is one module and one row, and the runner carries out whatever verdict it returns.

These run the real runner loop on a local process standing in for srun's step; Slurm is absent (its tools are
not found), which the runner treats as it treats an unanswering slurmctld: the step is stopped through srun.
"""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import pytest

from hpresilience.autoresume.decide.classify import Cause, classify
from hpresilience.autoresume.decide.verdicts import is_move
from hpresilience.autoresume.launch.plan import AttemptLaunch
from hpresilience.autoresume.launch.runner import StepRunner
from hpresilience.autoresume.launch.srunargs import SrunArgs
from hpresilience.autoresume.launch.stepops import StepOps
from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.settings import AutoResumeSettings, RunPolicySettings
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.autoresume.watch.base import Act, AttemptResult, StepView, Verdict
from hpresilience.autoresume.watch.evidence import HangInvestigator
from hpresilience.autoresume.watch.feed import RuleFeed
from hpresilience.autoresume.watch.nodewatch import NodeWatch
from hpresilience.autoresume.watch.rules import RuleSet
from hpresilience.autoresume.watch.table import DETECTORS, WatchContext, build_detectors
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.runner import CommandRunner
from hpresilience.slurm.srun import StepProcess

JOB = 4242
NODES = ("n1", "n2")


class Toy:
    """Says `act` about n2 at its third poll; counts its polls and starts."""

    name = "toy"

    def __init__(self, act: Act) -> None:
        self.act = act
        self.polls = 0
        self.starts = 0

    def start(self, step: StepView) -> None:
        self.starts += 1
        self.polls = 0

    def wait_s(self, now: float) -> float | None:
        return None

    def poll(self, now: float, step: StepView) -> Verdict | None:
        self.polls += 1
        if self.polls < 3:
            return None
        target = tuple(step.nodes) if self.act is Act.MOVE else None
        return Verdict(self.name, self.act, "toy says so", nodes=("n2",), target=target)


def _opts(tmp_path: Path, **watch: object) -> WrapperOptions:
    settings = AutoResumeSettings.model_validate({"move_grace_s": 0.0, "shutdown_timeout_s": 0.2, **watch})
    return WrapperOptions(
        job_id=JOB,
        srun=SrunArgs(command=["sleep", "30"]),
        srun_bin="srun",
        run_policy=RunPolicySettings(),
        state_dir=tmp_path,
        watch=settings,
    )


def _context(tmp_path: Path, opts: WrapperOptions) -> WatchContext:
    # No Slurm tool can be found: every Slurm call fails at once (retries off), as with an unanswering slurmctld.
    client = SlurmClient(CommandRunner(str(tmp_path / "no-slurm"), timeout=2.0, retries=0))
    reporter = Reporter(WrapperStateStore(tmp_path, JOB), JOB, None)
    progress = ProgressStream()
    return WatchContext(
        opts=opts,
        client=client,
        reporter=reporter,
        progress=progress,
        feed=RuleFeed(RuleSet([])),
        env={},
        investigator=HangInvestigator(client, JOB, tmp_path / "evidence", progress, reporter, {}, "M=1", 1.0),
        nodewatch=NodeWatch(client, JOB, 0.0),
        labels_ours=True,
        unhealthy=lambda job: set(),
        back_in_service=lambda size, nodes: None,
    )


def _run(ctx: WatchContext, toy: Toy, script: str = "import time; time.sleep(30)") -> tuple[AttemptResult, float]:
    runner = StepRunner(
        ctx.opts,
        ctx.client,
        ctx.feed,
        ctx.reporter,
        {},
        io.BytesIO(),
        io.BytesIO(),
        StepOps(ctx.client, JOB, {}, ctx.reporter, 10.0),
        [toy],
        progress=ctx.progress,
    )
    launch = AttemptLaunch(1, NODES, NODES, "n1", 29500, 1, str(JOB), 2)
    for d in runner.detectors:
        d.start(launch)
    step = StepProcess([sys.executable, "-c", script], {})
    runner.current, runner.current_name = step, runner.step_name(1)
    started = time.monotonic()
    result = runner.watch(step, launch, None)
    return result, time.monotonic() - started


def _events(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp_path / f"{JOB}.events.jsonl").read_text().splitlines()]


def test_a_registered_detector_is_built_after_the_table_rows_in_their_order(tmp_path: Path) -> None:
    toy = Toy(Act.NOTHING)
    registry = DETECTORS.extended({"toy": lambda ctx: toy})
    built = build_detectors(_context(tmp_path, _opts(tmp_path)), registry)
    assert [d.name for d in built] == [
        "rules",
        "stragglers",
        "hang",
        "silence",
        "stall",
        "nodes",
        "growback",
        "integrity",
        "toy",
    ]
    assert "toy" not in DETECTORS  # the shared table is left as it was


def test_a_watch_that_is_off_for_the_job_is_left_out(tmp_path: Path) -> None:
    opts = _opts(tmp_path, hang_detection=False, silent_node_s=0.0, silent_step_s=0.0, grow_back="never")
    assert [d.name for d in build_detectors(_context(tmp_path, opts))] == ["rules", "stragglers", "nodes", "integrity"]


def test_a_toy_detectors_stop_now_verdict_kills_the_step_and_blames_its_node(tmp_path: Path) -> None:
    toy = Toy(Act.STOP_NOW)
    result, took = _run(_context(tmp_path, _opts(tmp_path)), toy)
    assert took < 10  # the 30 s step was killed at the verdict, not waited for
    assert result.verdict is not None and result.verdict.detector == "toy"
    assert result.blamed == ["n2"]
    killed = [e for e in _events(tmp_path) if e["event"] == "step_killed"]
    assert killed and killed[0]["why"] == "toy says so"
    # After the step: a node blamed while the step ran is a hardware fault, swapped out at the relaunch.
    diagnosis = classify(result.exit_code, list(NODES), {}, NODES, [], None, result.blamed)
    assert diagnosis.cause is Cause.HARDWARE and diagnosis.bad_nodes == ("n2",)


@pytest.mark.parametrize("act", [Act.STOP_GRACE, Act.MOVE])
def test_a_toy_detectors_grace_or_move_verdict_stops_the_step_through_the_shutdown_path(
    tmp_path: Path, act: Act
) -> None:
    toy = Toy(act)
    result, took = _run(_context(tmp_path, _opts(tmp_path)), toy)
    assert took < 20
    events = [e["event"] for e in _events(tmp_path)]
    assert "step_stopping" in events and "step_killed" not in events
    assert result.verdict is not None and result.verdict.act is act
    # The verdict table: a move that knows where it goes is a planned move, anything else a fault to diagnose.
    assert is_move(result) is (act is Act.MOVE)
    if act is Act.MOVE:
        assert "step_move_decided" in events and result.target == list(NODES)


def test_a_nothing_verdict_is_kept_with_the_attempt_and_does_not_stop_the_step(tmp_path: Path) -> None:
    toy = Toy(Act.NOTHING)
    ctx = _context(tmp_path, _opts(tmp_path))
    runner = StepRunner(
        ctx.opts,
        ctx.client,
        ctx.feed,
        ctx.reporter,
        {},
        io.BytesIO(),
        io.BytesIO(),
        StepOps(ctx.client, JOB, {}, ctx.reporter, 10.0),
        [toy],
    )
    launch = AttemptLaunch(1, NODES, NODES, "n1", 29500, 1, str(JOB), 2)
    toy.start(launch)
    step = StepProcess([sys.executable, "-c", "import time; time.sleep(1)"], {})
    result = runner.watch(step, launch, None)
    assert result.exit_code == 0 and result.verdict is None
    assert result.verdicts and all(v.act is Act.NOTHING for v in result.verdicts)


class _CountingOps(StepOps):
    def __init__(self, ctx: WatchContext) -> None:
        super().__init__(ctx.client, JOB, {}, ctx.reporter, 10.0)
        self.reaped: list[list[str]] = []

    def reap_escaped(self, nodes: list[str]) -> None:
        self.reaped.append(nodes)


def test_a_reap_verdict_is_carried_out_by_the_runner_and_the_step_goes_on_being_watched(tmp_path: Path) -> None:
    # The hang watch found no task left (srun waits on an escaped process): the detector only says so; the runner
    # kills what escaped, and the step is not stopped for it (it ends by itself here, exit 0, no verdict).
    toy = Toy(Act.REAP)
    ctx = _context(tmp_path, _opts(tmp_path))
    ops = _CountingOps(ctx)
    runner = StepRunner(ctx.opts, ctx.client, ctx.feed, ctx.reporter, {}, io.BytesIO(), io.BytesIO(), ops, [toy])
    launch = AttemptLaunch(1, NODES, NODES, "n1", 29500, 1, str(JOB), 2)
    toy.start(launch)
    step = StepProcess([sys.executable, "-c", "import time; time.sleep(1)"], {})
    result = runner.watch(step, launch, None)
    assert result.exit_code == 0 and result.verdict is None
    assert ops.reaped and ops.reaped[0] == ["n2"]
    assert toy.polls > 3  # polled on after the reap
