"""Elastic auto-resume on the devcluster with HyperPod's recipe (torchrun on gloo): `--auto-resume-min-nodes`
keeps the step training on the healthy nodes after a fault with no spare, and the step moves back to full size
once the failed node is back in service, all in the same job; a spot reclaim announced to one node's agent
drains it and moves the step off it, every rank told within 2 s."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path

import pytest

from hpresilience.reasons import PlannedKind, parse_planned
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.fakeimds import FakeImds
from hpresilience.testing.fakenode import FakeNode
from tests.agent.test_notice_integration import agent_once
from tests.autoresume.test_recipe_integration import STEPS, Recipe, fill_the_rest, job_notices

pytestmark = pytest.mark.integration


def test_recipe_with_min_nodes_runs_short_at_once_then_grows_back_when_the_node_returns(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """3 nodes, --auto-resume-min-nodes=2, no spare: Action:Replace on one node relaunches the step on the other
    two within 3 s (world size 2, from the checkpoint, HPR_NODES_NOW=2); the node resumed, the step moves back
    to 3 nodes (a planned move, not a restart) and the job completes all its steps, never requeued."""
    run = Recipe(
        cluster,
        tmp_path,
        sbatch_args=("-N", "3"),
        srun_args="--auto-resume-min-nodes=2",
        extra_env={"TRAIN_STEP_SLEEP": "0.4"},
    )
    run.wait(lambda: "step=4\n" in run.out, "step 4", timeout=120)
    fill_the_rest(cluster, slurm, run, 3)
    run.wait(lambda: "step=6\n" in run.out, "step 6", timeout=120)
    job = slurm.job(run.job_id)
    victim = [n for n in job.nodes if n != job.batch_host][-1]
    with job_notices(slurm):
        slurm.set_node_state([victim], "fail", "Action:Replace")
        short = run.wait(lambda: run.named("step_running"), "the step on the healthy nodes")[0]
        assert short["restart_latency_s"] <= 3.0, short
        assert run.named("running_short")[0]["nodes_now"] == 2
        assert victim not in run.named("attempt_started")[-1]["nodes"].split(",")
        run.wait(lambda: len(re.findall(r"resumed from step", run.out)) >= 1, "the short step's resume")
        time.sleep(2.0)  # it trains a little on 2 nodes
        slurm.set_node_state([victim], "resume")
        moved = run.wait(lambda: run.named("step_moved"), "the move back to 3 nodes")[0]
    assert moved["nodes_now"] == 3 and victim in moved["nodes"].split(",")
    assert "back in service" in moved["why"]
    # The ranks got the notice (check_alive() False), saved and left; the step did not wait for the grace period.
    notice = run.named("step_notice_sent")[0]
    assert notice.get("missed") is None
    saved = re.search(r"moving: saved at step (\d+)", run.out)
    assert saved, run.out
    ended = run.named("attempt_ended")[1]
    print(
        f"fault -> step on 2 nodes: {short['restart_latency_s']:.2f} s; "
        f"notice -> step ended: {ended['time'] - notice['time']:.2f} s"
    )
    assert ended["time"] - notice["time"] < 10 and not run.named("step_move_overdue")
    run.wait_finished()
    assert re.findall(r"resumed from step (\d+)", run.out)[-1] == saved.group(1)  # back at 3 from that checkpoint
    views = re.findall(r"nnodes=(\d+)", run.out)
    assert views[:3] == ["3"] * 3 and "2" in views and views[-1] == "3", views
    assert len(re.findall(r"resumed from step", run.out)) == 2, run.out
    assert len(run.named("policy_decided")) == 1  # the move is not a restart
    assert not run.named("job_requeue_requested") and slurm.job(run.job_id).restart_count == 0
    assert STEPS == 30


def test_a_drained_node_is_a_planned_move_the_ranks_save_at_the_notice_and_go_on_without_it(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """A node of the step drained (maintenance, a reclaim notice; not FAIL/DOWN): the ranks are told, save
    and exit at the same step, and the step goes on on the other nodes from that checkpoint; once a node of
    the partition is idle again the job grows into it and the step moves back to 3 nodes; no move counts
    against the restart budget and the job completes."""
    run = Recipe(
        cluster,
        tmp_path,
        sbatch_args=("-N", "3"),
        srun_args="--auto-resume-min-nodes=2",
        extra_env={"TRAIN_STEP_SLEEP": "0.4"},
    )
    run.wait(lambda: "step=4\n" in run.out, "step 4", timeout=120)
    filler = fill_the_rest(cluster, slurm, run, 3)
    run.wait(lambda: "step=6\n" in run.out, "step 6", timeout=120)
    job = slurm.job(run.job_id)
    victim = [n for n in job.nodes if n != job.batch_host][-1]
    with job_notices(slurm):
        slurm.set_node_state([victim], "drain", "[hpr-agent] Planned:spot-interruption by 2026-11-25T23:59:00Z")
        drained_at = time.time()
        moved = run.wait(lambda: run.named("step_moved"), "the move off the drained node")[0]
    notice = run.named("step_notice_sent")[0]
    assert "drained" in moved["why"] and victim not in moved["nodes"].split(",") and moved["nodes_now"] == 2
    saved = re.search(r"moving: saved at step (\d+)", run.out)
    assert saved, run.out
    print(
        f"drain -> notice written: {notice['time'] - drained_at:.2f} s; "
        f"notice -> step ended: {run.named('attempt_ended')[0]['time'] - notice['time']:.2f} s"
    )
    run.wait(lambda: "resumed from step" in run.out, "the step on 2 nodes")
    assert re.findall(r"resumed from step (\d+)", run.out)[-1] == saved.group(1)
    slurm.cancel(filler)  # a node of the partition is idle again
    back = run.wait(lambda: run.named("step_moved")[1:], "the move into the idle node")[0]
    assert back["nodes_now"] == 3 and victim not in back["nodes"].split(",") and run.named("allocation_grown")
    run.wait_finished()
    assert not run.named("policy_decided") and not run.named("fault_seen")  # planned, not a fault
    assert not run.named("job_requeue_requested")


def test_a_spot_reclaim_on_one_node_drains_it_every_rank_stops_within_2_s_and_the_step_goes_on_without_it(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Issue 25's reclaim path end to end: the fake metadata server announces a spot reclaim for a node of the
    step, that node's agent (one cycle, as HealthCheckProgram runs it) drains it with the Planned reason, every
    rank of the recipe sees check_alive() False within 2 s of the drain, saves and exits, and the step goes on
    on the other two nodes from that checkpoint (a planned move: no fault, no restart) until the job completes."""
    run = Recipe(
        cluster,
        tmp_path / "job",
        sbatch_args=("-N", "3"),
        srun_args="--auto-resume-min-nodes=2",
        extra_env={"TRAIN_STEP_SLEEP": "0.4"},
    )
    # The other job fills the rest while the ranks start (no spare: the step goes on short, on the 2 nodes left),
    # and the reclaim's node is made ready: the 30 steps (12 s) must outlast only the agent's cycle. Filled after
    # step 4, the wait for Slurm to start the filler took 20 s under CI's load, and the training had finished.
    run.wait(lambda: slurm.job(run.job_id).is_running, "the recipe's job to run", timeout=120)
    fill_the_rest(cluster, slurm, run, 3)
    job = slurm.job(run.job_id)
    victim = [n for n in job.nodes if n != job.batch_host][-1]
    node = FakeNode.make(tmp_path / victim, "p5.48xlarge")
    run.wait(lambda: "step=4\n" in run.out, "step 4", timeout=120)
    with job_notices(slurm), FakeImds() as imds:
        imds.announce_spot("terminate", in_s=120)
        log = agent_once(cluster, node, victim, imds.url, tmp_path / "run" / "notice.json")
        moved = run.wait(lambda: run.named("step_moved"), "the move off the reclaimed node")[0]
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    drained = [e for e in events if e.get("event") == "node_drained_planned"]
    assert drained, log
    drained_at = datetime.fromisoformat(drained[0]["timestamp"].replace("Z", "+00:00")).timestamp()
    state = slurm.node(victim)
    planned = parse_planned(state.reason)
    assert state.has("DRAIN") and planned is not None and planned.kind is PlannedKind.RECLAIM, state

    # Every rank of the step (one per node) stopped on its own check_alive() False, within 2 s of the drain.
    stops = re.findall(r"moving: rank (\d+) stopped at ([\d.]+) check_alive=(\w+)", run.out)
    assert sorted(int(r) for r, _, _ in stops) == [0, 1, 2], run.out
    assert all(alive == "False" for _, _, alive in stops), stops
    noticed = max(float(t) for _, t, _ in stops) - drained_at
    print(f"drain -> every rank saw check_alive() False: {noticed:.2f} s")
    assert noticed < 2.0, stops

    # They saved and exited: a planned move to the other two nodes, from the checkpoint saved at the notice.
    assert "drained" in moved["why"] and moved["nodes_now"] == 2 and victim not in moved["nodes"].split(","), moved
    saved = re.search(r"moving: saved at step (\d+)", run.out)
    assert saved, run.out
    nodes = run.named("attempt_started")[-1]["nodes"].split(",")
    assert len(nodes) == 2 and victim not in nodes
    run.wait_finished()
    assert re.findall(r"resumed from step (\d+)", run.out) == [saved.group(1)]
    assert not run.named("policy_decided") and not run.named("fault_seen")  # planned, not a fault
    assert not run.named("job_requeue_requested") and slurm.job(run.job_id).restart_count == 0
