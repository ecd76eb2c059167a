"""Integration: how often the wrapper may resize a job depends on accounting, as it does in Slurm."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.autoresume.decide.capacity import Capacity
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperState, WrapperStateStore
from hpresilience.errors import SlurmError
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.conftest import TEST_BASE_PORT, require_slurm

pytestmark = pytest.mark.integration


def capacity_for(
    client: SlurmClient, job_id: int, tmp_path: Path, min_nodes: int = 0
) -> tuple[Capacity, WrapperState, Path]:
    store = WrapperStateStore(tmp_path, job_id)
    state = WrapperState(job_id)
    return (
        Capacity(
            client, job_id, state, Reporter(store, job_id, None), grow=True, replace_timeout_s=5, min_nodes=min_nodes
        ),
        state,
        store.events_path,
    )


def test_with_slurmdbd_bad_nodes_are_released_at_every_fault(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Two faults in one job: each bad node leaves the allocation (the once-per-job limit is gone)."""
    job_id = slurm.sbatch("-N4", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    job = slurm.wait_running(job_id)
    cap, state, _ = capacity_for(slurm, job_id, tmp_path)
    others = [n for n in job.nodes if n != job.batch_host]
    job = cap.release(job, {others[0]})
    assert others[0] not in job.nodes and state.resized
    job = cap.release(job, {others[1]})
    assert others[1] not in slurm.job(job_id).nodes and len(slurm.job(job_id).nodes) == 2
    assert cap.accounting() and not state.resize_refused


def test_without_slurmdbd_a_second_fault_keeps_the_bad_node_inside(tmp_path: Path) -> None:
    """accounting_storage/none: the first fault shrinks the job; the second keeps its bad node in the
    allocation (out of the step) instead of asking Slurm for a resize it refuses."""
    require_slurm()
    cl = DevCluster(state_dir=tmp_path / "noacct", nodes=3, base_port=TEST_BASE_PORT + 500, accounting=False)
    try:
        cl.up(timeout=60)
        client = cl.client()
        job_id = client.sbatch("-N3", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
        job = client.wait_running(job_id)
        cap, _, events = capacity_for(client, job_id, tmp_path)
        others = [n for n in job.nodes if n != job.batch_host]
        job = cap.release(job, {others[0]})
        assert others[0] not in job.nodes
        job = cap.release(job, {others[1]})
        assert others[1] in client.job(job_id).nodes
        assert not cap.accounting()
        assert "slurmdbd" in events.read_text() and "nodes_kept_in_allocation" in events.read_text()
        # Running short (min_nodes) without slurmdbd, no idle node (the released one drained): released, the
        # failed node could never join again (one resize per job), so it stays in the job, out of the step.
        client.set_node_state([others[0]], "drain", "maintenance")
        cap, _, events = capacity_for(client, job_id, tmp_path / "short", min_nodes=1)
        plan = cap.recover([others[1]], [job.batch_host, others[1]], 2)
        assert plan == [job.batch_host] and others[1] in client.job(job_id).nodes
        assert "could not grow back" in events.read_text()
    finally:
        cl.down()


def test_running_short_releases_the_failed_node_from_the_job(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """min_nodes, no idle node: the short plan comes at once and the failed node leaves the job, so that the
    controller repairs it now (it waits for a node's jobs) and the job's NodeList no longer names it."""
    job_id = slurm.sbatch("-N3", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    job = slurm.wait_running(job_id)
    filler = slurm.sbatch("-N1", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(filler)
    cap, state, events = capacity_for(slurm, job_id, tmp_path, min_nodes=2)
    victim = [n for n in job.nodes if n != job.batch_host][-1]
    slurm.set_node_state([victim], "fail", "Action:Replace")
    plan = cap.recover([victim], list(job.nodes), 3)
    assert plan == [n for n in job.nodes if n != victim]
    assert slurm.job(job_id).nodes == tuple(plan) and state.kept_out == []
    assert "running_short" in events.read_text() and "allocation_shrunk" in events.read_text()


class RefusingClient(SlurmClient):
    """The real session cluster, except that resizing answers what slurmctld says to a job whose resize met an
    unreachable slurmdbd (recorded on Slurm 22.05): the refusal that no retry ever clears."""

    def shrink_job(self, job_id: int, keep: object, timeout: float = 30.0) -> object:  # type: ignore[override]
        raise SlurmError(
            ["scontrol", "update", f"jobid={job_id}", "NodeList=n1"],
            1,
            f"Job update not available right now, the DB index is being set, try again in a bit for JobId={job_id}",
        )


def test_a_db_index_refusal_is_final_for_the_job(cluster: DevCluster, slurm: SlurmClient, tmp_path: Path) -> None:
    job_id = slurm.sbatch("-N3", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    job = slurm.wait_running(job_id)
    refusing = RefusingClient(slurm.runner)
    cap, state, events = capacity_for(refusing, job_id, tmp_path)
    others = [n for n in job.nodes if n != job.batch_host]
    cap.release(job, {others[0]})
    assert state.resize_refused
    assert cap.can_resize_again() is not None
    cap.release(slurm.job(job_id), {others[1]})
    assert set(slurm.job(job_id).nodes) == set(job.nodes)
    assert "refused to resize this job for good" in events.read_text()
