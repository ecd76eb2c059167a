"""The silence watch's probe runs beside the loop: a poll never waits on the srun that asks a silent node."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hpresilience.autoresume.progress import ProgressStream, RankInfo
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.autoresume.watch.base import Act, Verdict
from hpresilience.autoresume.watch.silencewatch import SilentNodes
from hpresilience.slurm.client import SlurmClient

NODES = ("n1", "n2")


class Stream(ProgressStream):
    """n1 printed just now, n2 long ago: n2 is the suspect."""

    def tasks(self) -> dict[int, RankInfo]:
        now = time.monotonic()
        return {0: RankInfo("n1", now, 1), 1: RankInfo("n2", now - 60.0, 1)}

    def median_interval(self) -> float | None:
        return None


class Step:
    attempt = 1
    nodes = NODES
    requested = 2


def _watch(tmp_path: Path, answer: dict[str, bool], release: threading.Event) -> SilentNodes:
    watch = SilentNodes(4.0, Stream(), Reporter(WrapperStateStore(tmp_path, 7), 7, None), SlurmClient(), 7, {})

    def slow_probe(suspects: object) -> dict[str, bool]:
        release.wait(10.0)  # a probe of a lost node takes its whole timeout
        return answer

    watch._ask = slow_probe  # type: ignore[method-assign]
    return watch


def _poll_until_verdict(watch: SilentNodes, release: threading.Event) -> tuple[float, list[Verdict]]:
    step = Step()
    watch.start(step)
    watch.next_check = 0.0
    slowest = 0.0
    seen: list[Verdict] = []
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        started = time.monotonic()
        verdict = watch.poll(started, step)
        slowest = max(slowest, time.monotonic() - started)
        if watch.probe is not None and not release.is_set():
            release.set()  # the probe is in flight: every poll so far returned at once
        if verdict is not None:
            seen.append(verdict)
            break
        if release.is_set() and watch.probe is None:
            break
        time.sleep(0.01)
    return slowest, seen


def test_a_poll_returns_at_once_while_the_probe_of_a_silent_node_runs(tmp_path: Path) -> None:
    release = threading.Event()
    slowest, seen = _poll_until_verdict(_watch(tmp_path, {"n2": False}, release), release)
    assert slowest < 0.5
    assert len(seen) == 1
    verdict = seen[0]
    assert verdict.act is Act.STOP_NOW and verdict.nodes == ("n2",) and verdict.unanswering


def test_a_silent_node_that_answers_the_probe_is_not_blamed(tmp_path: Path) -> None:
    release = threading.Event()
    _, seen = _poll_until_verdict(_watch(tmp_path, {"n2": True}, release), release)
    assert seen == []
