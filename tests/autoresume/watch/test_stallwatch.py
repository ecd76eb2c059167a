"""The stall watch (issue 36): a step silent everywhere for a few of its intervals gets every node probed; a node
that runs no task while another does is blamed, nodes that all answer leave the silence to the hang watch."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.autoresume.watch.base import Act, Verdict
from hpresilience.autoresume.watch.stallwatch import StalledStep, StallWatch
from hpresilience.slurm.client import SlurmClient


def test_no_probe_before_the_step_showed_two_progress_events_or_when_off() -> None:
    assert StallWatch(3.0).due(100.0, None, None) is None
    assert StallWatch(3.0).due(100.0, 50.0, None) is None  # one event: starting, not stalled
    assert StallWatch(0.0).due(100.0, 50.0, 0.5) is None


def test_a_silence_is_due_at_the_floor_or_three_of_the_steps_own_intervals_whichever_is_longer() -> None:
    watch = StallWatch(3.0)
    assert watch.due(102.9, 100.0, 0.5) is None
    assert watch.due(103.0, 100.0, 0.5) == 3.0
    assert watch.due(105.9, 100.0, 2.0) is None  # a 2 s step is silent 6 s before it is looked at
    assert watch.due(106.0, 100.0, 2.0) == 6.0


def test_nodes_that_answered_are_asked_again_at_twice_the_silence_and_new_progress_starts_over() -> None:
    watch = StallWatch(3.0)
    watch.answered(100.0, 3.5)
    assert watch.due(106.9, 100.0, 0.5) is None
    assert watch.due(107.0, 100.0, 0.5) == 7.0
    watch.answered(100.0, 7.5)
    assert watch.due(114.9, 100.0, 0.5) is None and watch.due(115.0, 100.0, 0.5) == 15.0
    assert watch.due(123.0, 120.0, 0.5) == 3.0  # progress came: the next silence starts at the floor again


class Stream(ProgressStream):
    """Progress every 0.5 s until `last`, nothing since."""

    def __init__(self, last: float) -> None:
        super().__init__()
        self.last = last

    def last_progress(self) -> float | None:
        return self.last

    def median_interval(self) -> float | None:
        return 0.5


class Step:
    attempt = 1
    nodes = ("n1", "n2")
    requested = 2


def _watch(tmp_path: Path, answer: dict[str, bool] | Exception, release: threading.Event) -> StalledStep:
    reporter = Reporter(WrapperStateStore(tmp_path, 7), 7, None)
    watch = StalledStep(3.0, Stream(time.monotonic() - 10.0), reporter, SlurmClient(), 7, {})

    def probe(nodes: list[str]) -> dict[str, bool]:
        assert nodes == ["n1", "n2"]  # every node of the step, in one look
        release.wait(10.0)  # a probe of a cut node takes its whole timeout
        if isinstance(answer, Exception):
            raise answer
        return answer

    watch._ask = probe  # type: ignore[method-assign]
    return watch


def _poll(watch: StalledStep, release: threading.Event) -> tuple[float, list[Verdict]]:
    step = Step()
    watch.start(step)
    slowest, seen = 0.0, []
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        started = time.monotonic()
        verdict = watch.poll(started, step)
        slowest = max(slowest, time.monotonic() - started)
        if watch.probe is not None and not release.is_set():
            release.set()  # the probe is in flight: every poll so far returned at once
        elif release.is_set() and watch.probe is None:
            seen += [verdict] if verdict is not None else []
            break
        time.sleep(0.01)
    return slowest, seen


def test_a_node_of_a_silent_step_that_runs_no_task_is_blamed_and_the_poll_never_waits_on_the_probe(
    tmp_path: Path,
) -> None:
    release = threading.Event()
    slowest, seen = _poll(_watch(tmp_path, {"n1": True, "n2": False}, release), release)
    assert slowest < 0.5
    [verdict] = seen
    assert verdict.detector == "stall" and verdict.act is Act.STOP_NOW
    assert verdict.nodes == ("n2",) and verdict.unanswering and "n2 not answering" in verdict.why
    events = (tmp_path / "7.events.jsonl").read_text()
    assert '"silent_step_probed"' in events and '"blamed": "n2"' in events


@pytest.mark.parametrize(
    "answer",
    [{"n1": True, "n2": True}, {"n1": False, "n2": False}, RuntimeError("srun not found")],
    ids=["all answer: a pause", "none answers: Slurm or this host cut off", "the probe failed"],
)
def test_a_silent_step_whose_probe_blames_no_single_node_is_left_to_the_hang_watch(
    tmp_path: Path, answer: dict[str, bool] | Exception
) -> None:
    release = threading.Event()
    watch = _watch(tmp_path, answer, release)
    _, seen = _poll(watch, release)
    assert seen == []
    assert watch.watch.due(time.monotonic(), watch.progress.last_progress(), 0.5) is None  # not asked again at once
