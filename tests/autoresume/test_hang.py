"""Hang detection without rules: when silence is a hang, and who is named for it."""

from __future__ import annotations

from hpresilience.autoresume.progress import ProgressStream, RankInfo
from hpresilience.autoresume.watch.hang import HangClock, attribute
from hpresilience.slurm.nodescripts import parse_live_lines, parse_probe_lines


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def stream_with_lines(every: float, count: int) -> tuple[ProgressStream, Clock]:
    clock = Clock()
    s = ProgressStream(clock)
    s.reset(["n1"])
    for i in range(count):
        s.feed_lines([f"0: step={i}"])
        clock.t += every
    clock.t -= every
    return s, clock


def test_nothing_is_declared_before_the_first_progress() -> None:
    s = ProgressStream(Clock())
    assert HangClock(s, 60, 10, 300).check(10_000) is None


def test_silence_reaching_the_floor_is_a_hang_at_that_instant_once_steps_are_fast() -> None:
    s, clock = stream_with_lines(0.25, 20)
    hc = HangClock(s, 60, 10, 300)
    last = clock.t
    assert hc.deadline() == last + 60
    assert hc.check(last + 59.99) is None
    due = hc.check(last + 60)
    assert due is not None and due.threshold_s == 60 and due.silent_s == 60 and not due.rechecked


def test_a_silence_whose_tasks_had_ended_starts_the_clock_again_and_the_next_deadline_is_final() -> None:
    s, clock = stream_with_lines(0.25, 20)
    hc = HangClock(s, 60, 10, 300)
    last = clock.t
    hc.dismiss(last + 60)
    assert not hc.check(last + 119) and hc.rechecking()
    due = hc.check(last + 120)
    assert due is not None and due.rechecked and due.silent_s == 120
    clock.t = last + 130
    s.feed_lines(["0: step=99"])  # new progress: a fresh silence, looked at again
    assert not hc.rechecking() and hc.deadline() == last + 190


def test_a_job_logging_every_20_s_gets_ten_times_that() -> None:
    s, clock = stream_with_lines(20, 5)
    hc = HangClock(s, 60, 10, 300)
    assert hc.threshold() == 200
    assert hc.check(clock.t + 199) is None and hc.check(clock.t + 201) is not None


def test_the_first_step_gets_the_longer_allowance() -> None:
    s, clock = stream_with_lines(1, 1)
    hc = HangClock(s, 60, 10, 300)
    assert hc.check(clock.t + 299) is None and hc.check(clock.t + 301) is not None


PROBE_N1 = """hpr-proc n1 100 S - 0 /bin/bash train.sh
hpr-proc n1 101 S 0 futex_wait_queue python -u train.py
hpr-probed n1
"""
PROBE_N2 = """hpr-proc n2 200 S - 0 /bin/bash train.sh
hpr-proc n2 201 T 1 do_signal_stop python -u train.py
hpr-probed n2
"""


def test_a_stopped_rank_is_named_unambiguously_with_its_node() -> None:
    reports = {"n1": parse_probe_lines(PROBE_N1)[0], "n2": parse_probe_lines(PROBE_N2)[0]}
    v = attribute(["n1", "n2"], reports, {101: True}, {})
    assert v.unambiguous and v.nodes == ["n2"] and v.ranks == [1]
    assert "stopped" in v.suspects[0].why


def test_a_rank_that_wrote_no_stack_when_asked_is_a_suspect() -> None:
    reports = {"n1": parse_probe_lines(PROBE_N1)[0], "n2": parse_probe_lines(PROBE_N2.replace(" T 1 ", " S 1 "))[0]}
    v = attribute(["n1", "n2"], reports, {101: True, 201: False}, {})
    assert v.unambiguous and v.nodes == ["n2"] and "no Python stack" in v.suspects[0].why


def test_suspects_on_two_nodes_or_none_at_all_are_ambiguous() -> None:
    n1 = parse_probe_lines(PROBE_N1.replace(" S 0 ", " D 0 "))[0]
    v = attribute(["n1", "n2"], {"n1": n1, "n2": parse_probe_lines(PROBE_N2)[0]}, {}, {})
    assert not v.unambiguous and set(v.nodes) == {"n1", "n2"}
    healthy = attribute(["n1"], {"n1": parse_probe_lines(PROBE_N1)[0]}, {101: True}, {})
    assert not healthy.unambiguous and healthy.suspects == []


def test_a_node_that_did_not_answer_and_a_vanished_rank_are_named() -> None:
    v = attribute(["n1", "n2"], {"n1": parse_probe_lines(PROBE_N1)[0], "n2": None}, {}, {})
    assert v.unambiguous and v.nodes == ["n2"] and v.unanswered == ["n2"]
    gone = attribute(["n1"], {"n1": parse_probe_lines(PROBE_N1)[0]}, {}, {5: RankInfo("n1", 0.0, 3, pid=999)})
    assert gone.ranks == [5] and "gone" in gone.suspects[0].why


def test_a_stopped_task_without_rank_in_its_environment_is_named_by_its_heartbeats_pid() -> None:
    """srun's own tasks (no torchrun) have SLURM_PROCID, not RANK: the heartbeat's pid names the rank, and the
    rank is not also reported gone (seen on the netns cluster: both ranks "gone", the hang ambiguous)."""
    n1 = parse_probe_lines(PROBE_N1.replace(" S 0 ", " S - "))[0]
    n2 = parse_probe_lines(PROBE_N2.replace(" T 1 ", " T - "))[0]
    ranks = {0: RankInfo("n1", 0.0, 3, pid=101), 1: RankInfo("n2", 0.0, 3, pid=201)}
    v = attribute(["n1", "n2"], {"n1": n1, "n2": n2}, {101: True}, ranks)
    assert v.unambiguous and v.nodes == ["n2"] and v.ranks == [1], v.suspects
    assert "rank 1 (pid 201) is stopped" in v.suspects[0].why and len(v.suspects) == 1


def test_a_stopped_process_of_the_job_with_no_rank_known_still_names_its_node() -> None:
    n1 = parse_probe_lines(PROBE_N1.replace(" S 0 ", " S - "))[0]
    n2 = parse_probe_lines(PROBE_N2.replace(" T 1 ", " T - "))[0]
    v = attribute(["n1", "n2"], {"n1": n1, "n2": n2}, {}, {})
    assert v.unambiguous and v.nodes == ["n2"] and v.ranks == [] and "no rank known" in v.suspects[0].why
    zombie = parse_probe_lines(PROBE_N2.replace(" T 1 ", " Z - "))[0]
    assert attribute(["n1", "n2"], {"n1": n1, "n2": zombie}, {}, {}).suspects == []


def test_probe_output_with_hostile_lines_is_skipped() -> None:
    procs, done = parse_probe_lines("hpr-proc\nhpr-proc n1 x S 0\nhpr-proc n1 5 S 99999999999 w c\nnoise\nhpr-probed")
    assert [p.pid for p in procs] == [5] and procs[0].rank is None and done == set()


def test_task_counts_are_read_per_node_and_hostile_lines_are_skipped() -> None:
    text = "hpr-live n1 0\nhpr-live n2 3\nhpr-live n3 x\nhpr-live n4 9999999999\nnoise\nhpr-live\n"
    assert parse_live_lines(text) == {"n1": 0, "n2": 3}
