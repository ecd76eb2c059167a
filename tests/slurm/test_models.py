"""Node and job states read the way Slurm means them."""

from __future__ import annotations

import pytest

from hpresilience.slurm.models import Job, Node


def node(*states: str) -> Node:
    return Node(name="n1", address="127.0.0.11", hostname="localhost", states=frozenset(states))


@pytest.mark.parametrize("flag", ["PLANNED", "RESERVED", "BLOCKED"])
def test_idle_node_promised_to_other_work_is_not_free(flag: str) -> None:
    assert node("IDLE").is_idle
    assert not node("IDLE", flag).is_idle


def job(state: str) -> Job:
    return Job(job_id=1, name="j", state=state, nodes=(), num_nodes=0, user="u")


@pytest.mark.parametrize(
    "state",
    [
        "REQUEUE_HOLD",
        "SPECIAL_EXIT",
        "STOPPED",
        "RESV_DEL_HOLD",
        "REQUEUED",
        "PENDING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "CONFIGURING",
    ],
)
def test_held_and_live_jobs_are_not_finished(state: str) -> None:
    """22.05/23.02 put a hold flag in job_state instead of the base state: the job is still alive."""
    assert not job(state).is_finished


@pytest.mark.parametrize("state", ["COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"])
def test_final_states_are_finished(state: str) -> None:
    assert job(state).is_finished
