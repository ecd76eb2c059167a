"""The silent-node suspect list: one node gone quiet while the others print (a partition), nobody else."""

from __future__ import annotations

from hpresilience.autoresume.progress import RankInfo
from hpresilience.autoresume.watch.silence import SilenceWatch, silent_nodes

NODES = ("n1", "n2", "n3")


def tasks(**last: float) -> list[RankInfo]:
    return [RankInfo(node, at, 1) for node, at in last.items()]


def test_a_node_silent_for_the_threshold_while_another_prints_is_a_suspect() -> None:
    assert silent_nodes(tasks(n1=99.0, n2=94.0), NODES, 100.0, 5.0) == ["n2"]


def test_a_node_silent_for_less_than_the_threshold_is_not() -> None:
    assert silent_nodes(tasks(n1=99.0, n2=96.0), NODES, 100.0, 5.0) == []


def test_every_node_silent_is_a_pause_or_a_hang_not_a_lost_node() -> None:
    assert silent_nodes(tasks(n1=90.0, n2=80.0), NODES, 100.0, 5.0) == []


def test_a_node_that_never_printed_and_a_node_outside_the_step_are_never_suspects() -> None:
    # n3 printed nothing (a trainer that logs on rank 0 only); n9 is not in the step.
    assert silent_nodes(tasks(n1=99.0, n9=10.0), NODES, 100.0, 5.0) == []
    assert silent_nodes(tasks(n1=99.0, n2=10.0, n9=10.0), NODES, 100.0, 5.0) == ["n2"]


def test_a_suspect_that_answered_is_not_probed_again_until_it_prints_again() -> None:
    watch = SilenceWatch(5.0)
    quiet = tasks(n1=99.0, n2=90.0)
    assert watch.suspects(quiet, NODES, 100.0) == ["n2"]
    watch.answered(["n2"], quiet, 100.0)
    assert watch.suspects(tasks(n1=104.0, n2=90.0), NODES, 105.0) == []
    # It printed once more, then went quiet again: a new silence, probed again once it lasts twice as long as the
    # one it answered in (10 s then: 20 s now), not at the first threshold.
    assert watch.suspects(tasks(n1=125.0, n2=110.0), NODES, 126.0) == []
    assert watch.suspects(tasks(n1=130.0, n2=110.0), NODES, 131.0) == ["n2"]


def test_a_node_whose_output_comes_in_lagging_bursts_is_probed_less_and_less_often() -> None:
    watch = SilenceWatch(4.0)
    probes = 0
    for burst in range(20):  # n1's output arrives at t = 10 k, n2's at 10 k + 3 (block-buffered, lagging)
        for t in (10.0 * burst + 4.5 + d for d in range(0, 10)):
            last_n2 = 10.0 * burst - 7.0 if t < 10.0 * burst + 3 else 10.0 * burst + 3.0
            ranks = tasks(n1=10.0 * burst, n2=last_n2)
            found = watch.suspects(ranks, NODES, t)
            if found:
                probes += 1
                watch.answered(found, ranks, t)
    assert probes <= 2, probes


def test_a_threshold_of_zero_turns_the_watch_off() -> None:
    assert SilenceWatch(0.0).suspects(tasks(n1=99.0, n2=10.0), NODES, 100.0) == []
