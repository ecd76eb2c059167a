"""Stragglers from per-rank step times, and collective-failure signatures."""

from __future__ import annotations

import pytest

from hpresilience.autoresume.progress import StepTime
from hpresilience.autoresume.watch.collective import CollectiveBudget, match_signature
from hpresilience.autoresume.watch.stragglers import StragglerDetector


def feed(d: StragglerDetector, t: float, times: dict[str, float]) -> None:
    for node, secs in times.items():
        d.add(StepTime(t, node, f"rank-{node}", secs))


def test_a_node_30_percent_slower_is_flagged_after_three_of_five_windows() -> None:
    d = StragglerDetector(0.2, 5, 10, start=0.0)
    found = []
    for w in range(5):
        feed(d, w * 10 + 5, {"n1": 0.25, "n2": 0.325})
        found += [(w, s) for s in d.tick(w * 10 + 10)]
    assert [(w, s.node) for w, s in found] == [(2, "n2")]
    assert found[0][1].ratio == pytest.approx(1.3)


def test_noise_below_the_fraction_and_a_single_slow_window_are_not_stragglers() -> None:
    d = StragglerDetector(0.2, 5, 10, start=0.0)
    found = []
    for w in range(10):
        slow = 0.5 if w == 3 else 0.27
        feed(d, w * 10 + 5, {"n1": 0.25, "n2": slow, "n3": 0.26})
        found += d.tick(w * 10 + 10)
    assert found == []


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (
            "[rank1]:[E1125 10:01:02.123 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog "
            "caught collective operation timeout: "
            "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds",
            "nccl_watchdog",
        ),
        (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
            "Connection closed by peer [10.0.0.2]:1234",
            "gloo_connection",
        ),
        (
            "RuntimeError: "
            "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 60000ms "
            "for recv operation to complete",
            "gloo_timeout",
        ),
        (
            "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
            "store_timeout",
        ),
    ],
)
def test_collective_failure_signatures_are_recognised(line: str, kind: str) -> None:
    assert match_signature(line) == kind


def test_ordinary_errors_are_not_collective_failures() -> None:
    assert match_signature("ValueError: bad learning rate") is None


def test_collective_retries_are_counted_per_period_and_nodes_per_implication() -> None:
    now = [0.0]
    b = CollectiveBudget(2, 100, clock=lambda: now[0])
    assert b.allow() and b.allow() and not b.allow()
    now[0] = 150.0
    assert b.allow()
    assert b.implicate("n2") == 1 and b.implicate("n2") == 2


def test_the_node_implicated_in_a_collective_failure_is_the_first_task_srun_reports_failed() -> None:
    from hpresilience.autoresume.decide.ending import first_failed_node

    errors = ["srun: error: n2: task 1: Exited with exit code 1", "srun: error: n1: task 0: Terminated"]
    assert first_failed_node(errors) == "n2"
    assert first_failed_node(["srun: error: Node failure on n3"]) is None
