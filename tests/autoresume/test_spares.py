"""Keeping the hot spares between faults (decide/spares.py): the pure choice, then the refill against real Slurm."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from hpresilience.autoresume.decide.spares import SpareRefill, to_take_back
from hpresilience.autoresume.watch.nodewatch import unfit_to_wait
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_capacity import capacity_for

EVERY_S = 30.0


def node(name: str, *states: str, reason: str = "") -> Node:
    return Node(name=name, address="", hostname="", states=frozenset(states), reason=reason)


def test_a_spare_marked_drained_failed_down_or_not_answering_is_unfit_to_wait_and_an_idle_one_is_not() -> None:
    assert not unfit_to_wait(node("n3", "IDLE"))
    assert not unfit_to_wait(node("n3", "ALLOCATED"))  # in the job, waiting: its standby runs there
    assert unfit_to_wait(node("n3", "ALLOCATED", "DRAIN", reason="maintenance"))
    assert unfit_to_wait(node("n3", "ALLOCATED", "FAIL", reason="Action:Replace"))
    assert unfit_to_wait(node("n3", "ALLOCATED", "NOT_RESPONDING"))
    assert unfit_to_wait(node("n3", "DOWN"))


def test_only_released_nodes_idle_without_a_flag_or_an_action_are_taken_back_at_most_as_many_as_missing() -> None:
    read = [
        node("n2", "IDLE", "DRAIN", reason="Action:Replace"),  # still being repaired
        node("n3", "ALLOCATED"),  # another job took it
        node("n4", "IDLE", "NOT_RESPONDING"),
        node("n5", "IDLE"),
        node("n6", "IDLE"),
    ]
    assert to_take_back(1, read, ["n1"]) == ["n5"]
    assert to_take_back(3, read, ["n1"]) == ["n5", "n6"]
    assert to_take_back(2, read, ["n1", "n5"]) == ["n6"]  # already back in the job
    assert to_take_back(0, read, ["n1"]) == []


@pytest.mark.integration
def test_a_spare_spent_on_a_replacement_is_made_good_by_the_failed_node_once_it_is_idle_again(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """A 3-node job, 2 in the step and 1 spare: the step's second node fails (Action:Replace) and the spare takes
    its slot. While the failed node is out of service nothing is taken back, not even the cluster's other idle
    node; once the operator resumes it, the next look merges it into the job as the new spare, and the look after
    finds nothing missing. A node the loop says must not come back (it left unanswering) is never taken."""
    job_id = slurm.sbatch("-N3", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    job = slurm.wait_running(job_id)
    cap, _, events = capacity_for(slurm, job_id, tmp_path)
    others = [n for n in job.nodes if n != job.batch_host]
    plan = [job.batch_host, others[0]]
    refill = SpareRefill(cap, cap.reporter, wanted=1, enabled=True, every_s=EVERY_S)
    assert refill.poll(0.0, plan, set()) == []  # no spare missing
    try:
        slurm.set_node_state([others[0]], "fail", "Action:Replace")
        plan = cap.recover([others[0]], plan, 2)
        assert plan == [job.batch_host, others[1]] and others[0] not in slurm.job(job_id).nodes
        now = 1.0
        assert refill.poll(now, plan, set()) == []  # FAIL: not back yet
        assert len(slurm.job(job_id).nodes) == 2  # the cluster's idle 4th node is not sought
        slurm.set_node_state([others[0]], "resume")
        now += EVERY_S / 2
        assert refill.poll(now, plan, set()) == []  # too soon after the last look
        now += EVERY_S
        assert refill.poll(now, plan, {others[0]}) == []  # left unanswering: only a fault takes it back
        now += EVERY_S
        assert refill.poll(now, plan, set()) == [others[0]]
        assert sorted(slurm.job(job_id).nodes) == sorted([*plan, others[0]])
        now += EVERY_S
        assert refill.poll(now, plan, set()) == []
        assert len(slurm.job(job_id).nodes) == 3
    finally:
        with contextlib.suppress(HPResilienceError):  # Slurm refuses to resume a node in service
            slurm.set_node_state([others[0]], "resume")
    said = [json.loads(line) for line in events.read_text().splitlines()]
    refilled = [e for e in said if e["event"] == "spares_refilled"]
    assert [(e["nodes"], e["spares_wanted"]) for e in refilled] == [(others[0], 1)]
    assert [e["why"] for e in said if e["event"] == "allocation_grown"] == ["spare_refill"]


@pytest.mark.integration
def test_a_spare_that_goes_out_of_service_leaves_the_job_its_standby_stopped_first_and_comes_back_once_repaired(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """The agent marks the spare (a GPU fault while it waits): at the next look its standby is stopped and it leaves
    the job, so the controller may repair it at once and the job no longer counts a spare it cannot use; resumed,
    it is taken back as the spare."""
    job_id = slurm.sbatch("-N3", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    job = slurm.wait_running(job_id)
    cap, state, events = capacity_for(slurm, job_id, tmp_path)
    plan = [job.batch_host, *[n for n in job.nodes if n != job.batch_host][:1]]
    (spare,) = set(job.nodes) - set(plan)
    stopped: list[list[str]] = []
    refill = SpareRefill(cap, cap.reporter, wanted=1, enabled=True, every_s=EVERY_S, before_leaving=stopped.append)
    try:
        slurm.set_node_state([spare], "fail", "Action:Replace")
        assert refill.poll(0.0, plan, set()) == []
        assert stopped == [[spare]] and spare not in slurm.job(job_id).nodes
        assert spare in state.blamed_nodes
        slurm.set_node_state([spare], "resume")
        assert refill.poll(EVERY_S, plan, set()) == [spare]
        assert spare in slurm.job(job_id).nodes and stopped == [[spare]]
    finally:
        with contextlib.suppress(HPResilienceError):
            slurm.set_node_state([spare], "resume")
    said = [json.loads(line) for line in events.read_text().splitlines()]
    left = [e for e in said if e["event"] == "spares_out_of_service"]
    assert [e["nodes"] for e in left] == [spare] and "fail" in left[0]["states"]
    assert [e["released"] for e in said if e["event"] == "allocation_shrunk"] == [spare]
