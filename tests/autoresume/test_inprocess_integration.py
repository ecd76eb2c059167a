"""Recovery without rollback on the devcluster (`--auto-resume-mode=inprocess`, issue 33): a data-parallel job
with no checkpointing at all loses a training node and goes on with the survivors' processes and state."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.checkpointless import die_outright
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_wrapper_integration import Run
from tests.torch.localworld import TRAIN, digests, fault_free_digest, joined

pytestmark = pytest.mark.integration
pytest.importorskip("torch")

STEPS = 120


def wait_for(probe: object, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def training_job(cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, options: str, nodes: int) -> Run:
    """The example's data-parallel training (2 ranks per node, no checkpoint anywhere) under `srun --auto-resume=1
    <options>` in a job of `nodes` nodes."""
    (tmp_path / "job").mkdir()
    return Run(
        cluster,
        slurm,
        tmp_path / "job",
        options,
        f"--ntasks-per-node=2 --overcommit python {TRAIN}",
        nodes=nodes,
        env={"TRAIN_STEPS": str(STEPS), "STEP_SLEEP": "0.15", "HPR_WORLD_WAIT_S": "120"},
    )


def run_through_a_fault(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, fault: Callable[[Run], None], standby: str = "spares"
) -> tuple[Run, float]:
    """The job (2 training nodes x 2 ranks + 1 spare, no checkpoint anywhere) through `fault` on n2 after step 10;
    the job and the seconds from the fault to the last rank training again. Asserts what every fault must keep:
    the survivors on n1 keep their PIDs, the spare's ranks (2, 3) got their state from rank 0, every step once
    and in order (nothing rolled back), final weights equal bit for bit to the same run's with no fault.
    `standby`: --auto-resume-standby (spares: the spare's ranks wait warm from the start; off: started cold)."""
    reference = fault_free_digest(tmp_path / "reference", 4, STEPS)
    options = f"--auto-resume-mode=inprocess --auto-resume-spares=1 --auto-resume-standby={standby}"
    run = training_job(cluster, slurm, tmp_path, options, 3)
    try:
        run.wait_output("step=10 ", timeout=180)
        first = {int(j["rank"]): j for j in joined(run.out) if j["generation"] == "1"}
        written = run.named("inprocess_world_written")
        assert written[0]["nodes"] == "n1,n2" and written[0]["world_size"] == 4
        job = slurm.job(run.job_id)
        assert job.batch_host == "n1"
        # The job's third node, its spare: Slurm's pick among the idle nodes (n3 mostly; 26.05 once took n4).
        (spare,) = set(job.nodes) - {"n1", "n2"}
        faulted_at = time.time()
        fault(run)
        wait_for(lambda: len([j for j in joined(run.out) if j["generation"] == "2"]) == 4, "the new world", 240)
        back_at = max(float(j["at"]) for j in joined(run.out) if j["generation"] == "2")
        assert run.wait_done(240) == "0", run.out + run.err
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
    out = run.out
    second = {int(j["rank"]): j for j in joined(out) if j["generation"] == "2"}
    assert [second[r]["pid"] for r in (0, 1)] == [first[r]["pid"] for r in (0, 1)], out
    assert [second[r]["state_from"] for r in (2, 3)] == ["0", "1"], out  # one survivor each, dealt round
    replaced = run.named("inprocess_replaced")
    assert len(replaced) == 1 and replaced[0]["replaced"] == "n2" and replaced[0]["nodes"] == f"n1,{spare}"
    assert not run.named("inprocess_fallback") and not run.named("attempt_started")
    done = [int(s) for s in re.findall(r"^step=(\d+) ", out, re.MULTILINE)]
    assert done == list(range(1, STEPS + 1)), done
    final = digests(out)
    assert len(final) == 4 and set(final.values()) == {reference}, out
    return run, back_at - faulted_at


def test_an_operators_replace_keeps_the_survivors_processes_and_the_weights_equal_the_fault_free_runs(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """`scontrol update node=n2 state=fail reason=Action:Replace` mid-run: the node watch sees it, only n2's step
    is cancelled, the job shrinks off n2 and the spare's step, launched then (no warm standby), joins the new
    world."""
    try:
        run, took = run_through_a_fault(
            cluster, slurm, tmp_path, lambda run: slurm.set_node_state(["n2"], "fail", "Action:Replace"), "off"
        )
    finally:
        with contextlib.suppress(Exception):
            slurm.set_node_state(["n2"], "resume")
    assert run.named("node_fault_seen")[0]["node"] == "n2"
    assert run.named("allocation_shrunk")[0]["released"] == "n2"
    assert not run.named("standby_started") and "hpr-inprocess standby" not in run.out
    print(f"in-process recovery (Action:Replace, cold): fault -> every rank training again {took:.2f} s")


def test_with_a_warm_standby_the_replacements_ranks_are_processes_started_before_the_fault_and_the_weights_equal(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """The spare n3 runs a standby step from the job's start (torch imported, model built, in no world). On
    `Action:Replace` of n2 the wrapper launches no step: n3's standby step becomes slot 1's, and ranks 2 and 3
    of the new world are the very processes that printed their standby line before the fault (same PIDs), with
    their state from rank 0 and the fault-free run's final weights (run_through_a_fault's checks)."""
    try:
        run, took = run_through_a_fault(
            cluster, slurm, tmp_path, lambda run: slurm.set_node_state(["n2"], "fail", "Action:Replace")
        )
    finally:
        with contextlib.suppress(Exception):
            slurm.set_node_state(["n2"], "resume")
    out = run.out
    fault_at = float(run.named("fault_seen")[0]["time"])
    waiting = [
        dict(kv.split("=", 1) for kv in ln.split()[2:]) for ln in out.splitlines() if "hpr-inprocess standby " in ln
    ]
    spare = run.named("inprocess_replaced")[0]["nodes"].split(",")[1]  # the job's spare (run_through_a_fault)
    assert sorted(w["local"] for w in waiting) == ["0", "1"] and {w["node"] for w in waiting} == {spare}, out
    assert all(float(w["at"]) < fault_at for w in waiting), (waiting, fault_at)
    second = {int(j["rank"]): j for j in joined(out) if j["generation"] == "2"}
    by_local = {w["local"]: w["pid"] for w in waiting}
    assert [second[2]["pid"], second[3]["pid"]] == [by_local["0"], by_local["1"]], out
    assert not [j for j in joined(out) if j["generation"] == "1" and int(j["rank"]) >= 4]  # never in world 1
    started = run.named("standby_started")
    assert [(e["node"], e["after_generation"]) for e in started] == [(spare, 1)]  # none launched after the fault
    assert [e["node"] for e in run.named("standby_taken")] == [spare]
    print(f"in-process recovery (Action:Replace, warm standby): fault -> every rank training again {took:.2f} s")


def test_a_node_that_dies_outright_is_replaced_in_process_long_before_slurmd_timeout(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """n2's slurmd and its tasks are killed (a kernel panic; nobody marks the node): n2's step ends, n2 runs no
    task when probed, so it is replaced (left in the job for Slurm to excise) and the survivors go on."""

    def die(run: Run) -> None:
        assert die_outright(cluster, "n2", run.job_id) == 2

    try:
        run, took = run_through_a_fault(cluster, slurm, tmp_path, die)
    finally:
        cluster.start_node("n2")
    probed = run.named("nodes_probed")
    assert probed[0]["unanswering"] == "n2", probed
    # A node that does not answer while Slurm still calls it responding leaves the job at once (issue 36), so its
    # DOWN, SlurmdTimeout later, cannot end the job.
    assert [s["released"] for s in run.named("allocation_shrunk")] == ["n2"]
    print(f"in-process recovery (dead node): fault -> every rank training again {took:.2f} s")


def test_a_rank_that_crashes_falls_back_to_the_relaunch_path_and_the_job_still_ends_with_the_same_weights(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Rank 2 exits 1 at step 8 on a healthy node (an application error, not a node fault): its node-mate waits
    for a new world that does not come (HPR_WORLD_WAIT_S=5) and gives up (exit 86), n2's step ends and n2
    answers the probe (or the survivors give up first): in-process recovery cannot finish. The wrapper says so
    (`inprocess_fallback`), relaunches every rank the ordinary way, and the same code trains from step 0 (no
    checkpoint) to the fault-free run's weights."""
    reference = fault_free_digest(tmp_path / "reference", 4, 40)
    (tmp_path / "job").mkdir()
    config = tmp_path / "config.yaml"
    config.write_text("autoresume:\n  full_node_check_s: 0.5\n")
    run = Run(
        cluster,
        slurm,
        tmp_path / "job",
        "--auto-resume-mode=inprocess --auto-resume-spares=1",
        f"--ntasks-per-node=2 --overcommit python {TRAIN}",
        nodes=3,
        env={
            "TRAIN_STEPS": "40",
            "STEP_SLEEP": "0.1",
            "HPR_WORLD_WAIT_S": "5",
            "DIE_RANK": "2",
            "DIE_STEP": "8",
            "HPRESILIENCE_CONFIG": str(config),
        },
    )
    try:
        assert run.wait_done(300) == "0", run.out + run.err
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
    fallback = run.named("inprocess_fallback")
    assert len(fallback) == 1 and fallback[0]["generation"] == 1, run.err
    assert "n2" in fallback[0]["why"] or "could not finish" in fallback[0]["why"], fallback
    assert len(run.named("attempt_started")) == 1 and not run.named("inprocess_replaced")
    final = digests(run.out)
    assert len(final) == 4 and set(final.values()) == {reference}, run.out


def test_two_replacements_in_one_job_keep_the_first_survivors_and_the_weights(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Two spares, two faults in a row: n2 is replaced by n3 (generation 2), then n3 itself by n4 (generation 3).
    n1's ranks are the same processes throughout, each new pair gets its state from rank 0, and the weights are
    the fault-free run's."""
    reference = fault_free_digest(tmp_path / "reference", 4, STEPS)
    run = training_job(cluster, slurm, tmp_path, "--auto-resume-mode=inprocess --auto-resume-spares=2", 4)

    def in_world(generation: int) -> list[dict[str, str]]:
        return [j for j in joined(run.out) if j["generation"] == str(generation)]

    try:
        run.wait_output("step=10 ", timeout=180)
        slurm.set_node_state(["n2"], "fail", "Action:Replace")
        wait_for(lambda: len(in_world(2)) == 4, "generation 2", 240)
        resumed = int(in_world(2)[0]["step"])
        run.wait_output(f"step={resumed + 5} ", timeout=120)
        slurm.set_node_state(["n3"], "fail", "Action:Replace")
        wait_for(lambda: len(in_world(3)) == 4, "generation 3", 240)
        assert run.wait_done(240) == "0", run.out + run.err
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
        with contextlib.suppress(Exception):
            slurm.set_node_state(["n2", "n3"], "resume")
    out = run.out
    pids = {g: {int(j["rank"]): j["pid"] for j in in_world(g)} for g in (1, 2, 3)}
    assert pids[1][0] == pids[2][0] == pids[3][0] and pids[1][1] == pids[2][1] == pids[3][1], out
    assert pids[2][2] != pids[3][2] and pids[1][2] != pids[2][2]
    third = {int(j["rank"]): j["state_from"] for j in in_world(3)}
    assert [third[2], third[3]] == ["0", "1"], out
    assert [e["nodes"] for e in run.named("inprocess_replaced")] == ["n1,n3", "n1,n4"]
    done = [int(s) for s in re.findall(r"^step=(\d+) ", out, re.MULTILINE)]
    assert done == list(range(1, STEPS + 1)), done
    assert set(digests(out).values()) == {reference} and len(digests(out)) == 4, out


def test_a_failed_node_repaired_in_time_is_its_own_replacement_and_its_slot_gets_new_ranks(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """No spare and no other node to take (n3 and n4 drained): after `Action:Replace` on n2 the job waits for a
    replacement; n2, repaired (resumed), is grown back into the job under its own name and in its own slot, as
    HyperPod's replacement comes back. Its slot still gets new ranks (a step launched there, state from rank 0):
    the world is not written as if nothing had changed, with the survivors waiting for ranks that never come."""
    reference = fault_free_digest(tmp_path / "reference", 4, STEPS)
    slurm.set_node_state(["n3", "n4"], "drain", "held out by the test")
    try:
        run = training_job(cluster, slurm, tmp_path, "--auto-resume-mode=inprocess", 2)
        run.wait_output("step=10 ", timeout=180)
        first = {int(j["rank"]): j for j in joined(run.out) if j["generation"] == "1"}
        slurm.set_node_state(["n2"], "fail", "Action:Replace")
        wait_for(lambda: run.named("waiting_for_replacement"), "the wait for a replacement", 120)
        slurm.set_node_state(["n2"], "resume")
        wait_for(lambda: len([j for j in joined(run.out) if j["generation"] == "2"]) == 4, "the new world", 240)
        assert run.wait_done(240) == "0", run.out + run.err
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
        slurm.set_node_state(["n3", "n4"], "resume")
        with contextlib.suppress(Exception):
            slurm.set_node_state(["n2"], "resume")
    out = run.out
    written = run.named("inprocess_world_written")
    assert [w["nodes"] for w in written] == ["n1,n2", "n1,n2"] and written[1]["new_ranks"] == "2,3", written
    second = {int(j["rank"]): j for j in joined(out) if j["generation"] == "2"}
    assert [second[r]["pid"] for r in (0, 1)] == [first[r]["pid"] for r in (0, 1)], out
    assert [second[r]["state_from"] for r in (2, 3)] == ["0", "1"], out  # one survivor each, dealt round
    assert [second[r]["pid"] for r in (2, 3)] != [first[r]["pid"] for r in (2, 3)], out
    assert not run.named("inprocess_fallback") and not run.named("attempt_started")
    done = [int(s) for s in re.findall(r"^step=(\d+) ", out, re.MULTILINE)]
    assert done == list(range(1, STEPS + 1)), done
    assert set(digests(out).values()) == {reference} and len(digests(out)) == 4, out
