"""The in-process mode's hang watch (autoresume/inprocess_watch.py), on a fake clock and a fake probe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpresilience.autoresume.inprocess_watch import InProcessHangs
from hpresilience.autoresume.launch.plan import AttemptLaunch
from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.autoresume.watch.hang import Attribution, HangDue, Suspect

PLAN = ["n1", "n2", "n3"]
FLOOR = 5.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Probe:
    """Stands in for watch/evidence.HangInvestigator: returns the attribution it was given, counts its calls."""

    def __init__(self, tmp: Path, found: Attribution) -> None:
        self.root = tmp / "evidence"
        self.found = found
        self.calls: list[HangDue] = []

    def __call__(self, launch: Any, due: HangDue) -> Attribution:
        self.calls.append(due)
        return self.found


def watch(
    tmp: Path, found: Attribution, **settings: Any
) -> tuple[InProcessHangs, ProgressStream, Clock, Probe, list[tuple[str, str]]]:
    clock = Clock()
    stream = ProgressStream(clock)
    opts = WrapperOptions(
        job_id=7, srun=None, srun_bin="srun", run_policy=None, state_dir=tmp,  # type: ignore[arg-type]
        watch=AutoResumeSettings.model_validate({"hang_floor_s": FLOOR, "hang_first_step_s": FLOOR, **settings}),
    )  # fmt: skip
    marks: list[tuple[str, str]] = []

    def mark(node: str, why: str, evidence: str) -> bool:
        marks.append((node, why))
        return True

    probe = Probe(tmp, found)
    hangs = InProcessHangs(opts, stream, probe, Reporter(WrapperStateStore(tmp, 7), 7, None), mark)  # type: ignore[arg-type]
    return hangs, stream, clock, probe, marks


def view(generation: int) -> AttemptLaunch:
    return AttemptLaunch(generation, tuple(PLAN), tuple(PLAN), "", 0, 2, requested=3)


def beat(stream: ProgressStream, rank: int, step: int) -> None:
    stream.feed_lines([f"[hpr-heartbeat] rank={rank} node={PLAN[rank // 2]} pid={100 + rank} step={step}"])


def events(tmp: Path, name: str) -> list[dict[str, Any]]:
    lines = (tmp / "7.events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


STOPPED = Attribution(
    suspects=[Suspect("n2", 3, 103, "rank 3 (pid 103) is stopped (SIGSTOP or a debugger), wchan do_signal_stop")],
    answered=PLAN,
)


def test_a_silence_past_the_floor_that_the_probe_pins_on_one_node_marks_and_names_that_node(tmp_path: Path) -> None:
    hangs, stream, clock, probe, marks = watch(tmp_path, STOPPED)
    hangs.new_world(1, PLAN, 2, [])
    for step in (1, 2):
        for rank in range(6):
            beat(stream, rank, step)
        clock.t += 0.2
    clock.t += FLOOR - 0.3
    assert hangs.poll(clock.t, view(1)) is None and not probe.calls  # not yet: the floor has not passed
    clock.t += 0.2
    hung = hangs.poll(clock.t, view(1))
    assert hung is not None and hung.node == "n2" and hung.marked and "stopped" in hung.why
    assert [m[0] for m in marks] == ["n2"] and marks[0][1].startswith("hang: rank 3")
    assert events(tmp_path, "inprocess_hang_attributed")[0]["node"] == "n2"


def test_a_hang_that_names_no_single_node_is_returned_without_a_node_and_marks_nothing(tmp_path: Path) -> None:
    spread = Attribution(suspects=[Suspect("n2", 2, 102, "stopped"), Suspect("n3", 4, 104, "stopped")], answered=PLAN)
    hangs, stream, clock, _, marks = watch(tmp_path, spread)
    hangs.new_world(1, PLAN, 2, [])
    beat(stream, 0, 1)
    clock.t += FLOOR + 1
    hung = hangs.poll(clock.t, view(1))
    assert hung is not None and hung.node is None and "names no single node" in hung.why
    assert not marks and events(tmp_path, "inprocess_hang_unattributed")


def test_a_silence_in_which_the_probe_finds_nothing_is_looked_at_again_a_threshold_later_before_it_falls_back(
    tmp_path: Path,
) -> None:
    """Every node answered, no rank stood out (a world whose ranks are exiting after their last step looks so):
    looked at again a threshold later; the same silence then names no node."""
    hangs, stream, clock, probe, _ = watch(tmp_path, Attribution(answered=PLAN))
    hangs.new_world(1, PLAN, 2, [])
    for step in (1, 2):
        beat(stream, 0, step)
        clock.t += 0.2
    clock.t += FLOOR
    assert hangs.poll(clock.t, view(1)) is None and len(probe.calls) == 1
    assert events(tmp_path, "inprocess_hang_rechecked")
    clock.t += FLOOR - 0.5
    assert hangs.poll(clock.t, view(1)) is None and len(probe.calls) == 1  # not before the threshold
    clock.t += 0.6
    hung = hangs.poll(clock.t, view(1))
    assert hung is not None and hung.node is None and len(probe.calls) == 2


def gone(rank: int) -> Suspect:
    node = PLAN[rank // 2]
    why = f"rank {rank} sent heartbeats from {node} and its process is gone"
    return Suspect(node, rank, 100 + rank, why, exited=True)


def test_a_silence_in_which_every_rank_has_exited_is_looked_at_again_and_one_rank_gone_is_its_nodes_hang(
    tmp_path: Path,
) -> None:
    """Every rank's process gone, every node answering: the training ended and the steps' ends are not yet seen
    (seen after the loop waited out a returned node's quiet): looked at again, not a hang with no node. One rank
    gone while the others wait names its node at once."""
    hangs, stream, clock, probe, _ = watch(tmp_path, Attribution(suspects=[gone(r) for r in range(6)], answered=PLAN))
    hangs.new_world(1, PLAN, 2, [])
    for rank in range(6):
        beat(stream, rank, 1)
    clock.t += FLOOR + 1
    assert hangs.poll(clock.t, view(1)) is None and len(probe.calls) == 1
    assert events(tmp_path, "inprocess_hang_rechecked") and not events(tmp_path, "inprocess_hang_unattributed")

    probe.found = Attribution(suspects=[gone(3)], answered=PLAN)
    hangs.new_world(2, PLAN, 2, [])
    for rank in range(6):
        beat(stream, rank, 2)
    clock.t += FLOOR + 1
    hung = hangs.poll(clock.t, view(2))
    assert hung is not None and hung.node == "n2" and "process is gone" in hung.why


def test_the_silence_of_a_recovery_is_judged_against_the_first_steps_allowance_until_a_new_rank_trains(
    tmp_path: Path,
) -> None:
    """After a new world the survivors wait for the replacement (seconds of silence by design, more than the
    floor): no hang within hang_first_step_s of the announce, whatever a survivor printed after it; past it, the
    probe looks (a rank stopped during the recovery); once a replaced slot's rank trains, the floor again."""
    hangs, stream, clock, probe, _ = watch(tmp_path, STOPPED, hang_first_step_s=60)
    hangs.new_world(2, PLAN, 2, [1])  # slot 1 (ranks 2, 3) replaced
    beat(stream, 0, 40)  # a survivor's last step of the old world, read after the announce
    clock.t += 10 * FLOOR
    assert hangs.poll(clock.t, view(2)) is None and not probe.calls
    clock.t += 60 - 10 * FLOOR
    hung = hangs.poll(clock.t, view(2))
    assert hung is not None and hung.node == "n2" and probe.calls[0].threshold_s == 60

    hangs.new_world(3, PLAN, 2, [2])  # slot 2 (ranks 4, 5) replaced
    clock.t += 1
    beat(stream, 4, 41)  # the replacement trains: from its second step on, the floor
    clock.t += 0.2
    beat(stream, 4, 42)
    clock.t += FLOOR + 0.1
    hung = hangs.poll(clock.t, view(3))
    assert hung is not None and hung.node == "n2" and probe.calls[1].threshold_s == FLOOR


def test_marking_off_still_names_the_node_and_marks_nothing(tmp_path: Path) -> None:
    hangs, stream, clock, _, marks = watch(tmp_path, STOPPED, mark_suspect_nodes=False)
    hangs.new_world(1, PLAN, 2, [])
    beat(stream, 0, 1)
    clock.t += FLOOR + 1
    hung = hangs.poll(clock.t, view(1))
    assert hung is not None and hung.node == "n2" and not hung.marked and not marks


def test_every_nodes_step_gets_the_heartbeat_rate_of_the_settings(tmp_path: Path) -> None:
    hangs, *_ = watch(tmp_path, STOPPED, heartbeat_every_s=0.5)
    assert InProcessHangs.step_env(hangs.opts) == {"HPR_HEARTBEAT_EVERY_S": "0.5"}
