"""When in-process recovery cannot finish (issue 33, "Fallback"), on the devcluster: a second fault during the
recovery, a recovery past its bound, and a lost shard with no surviving replica all fall back to the relaunch path,
which resumes from the last checkpoint and ends with the fault-free run's weights, and the events say why."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_wrapper_integration import Run
from tests.conftest import shared_result
from tests.torch.localworld import REPO, LocalWorld, digests

# A fault-free reference run, the job, its fallback and relaunch: each process start is an import of torch, which
# takes tens of seconds on a loaded 2-core machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
pytest.importorskip("torch")

SCRIPT = REPO / "examples" / "checkpointless" / "train_fallback.py"
STEPS = 40


def reference(tmp: Path, shard_block: int) -> dict[int, str]:
    """Each rank's final weights in the same job with no fault (4 ranks, shards as the job declares them). The run
    is deterministic (4 torch starts), so a run of the suite computes it once per `shard_block`."""
    got = shared_result(f"fallback-{STEPS}-{shard_block}", lambda: _run_reference(tmp, shard_block))
    return {int(rank): digest for rank, digest in got.items()}  # JSON's keys are text


def _run_reference(tmp: Path, shard_block: int) -> dict[int, str]:
    tmp.mkdir(parents=True)
    env = {"TRAIN_STEPS": str(STEPS), "STEP_SLEEP": "0", "CKPT_DIR": str(tmp / "ckpt"), "SHARD_BLOCK": str(shard_block)}
    world = LocalWorld(tmp, 4, env, script=SCRIPT)
    for rank in range(4):
        world.start(rank)
    assert set(world.finish().values()) == {0}, world.output()
    return digests(world.output())


def wait_for(probe: object, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def run_replacing_n2(
    cluster: DevCluster,
    slurm: SlurmClient,
    tmp_path: Path,
    spares: int,
    env: dict[str, str],
    then: Callable[[Run], None] | None = None,
) -> Run:
    """The job (2 training nodes x 2 ranks + `spares`, a checkpoint every 5 steps) through an Action:Replace of n2
    at step 12 (then `then`: a second fault), run to its end; the nodes are resumed whatever happened."""
    (tmp_path / "job").mkdir()
    run = Run(
        cluster,
        slurm,
        tmp_path / "job",
        f"--auto-resume-mode=inprocess --auto-resume-spares={spares}",
        f"--ntasks-per-node=2 --overcommit python {SCRIPT}",
        nodes=2 + spares,
        env={"TRAIN_STEPS": str(STEPS), "STEP_SLEEP": "0.15", "HPR_WORLD_WAIT_S": "120", **env},
    )
    try:
        run.wait_output("step=12 ", timeout=180)
        slurm.set_node_state(["n2"], "fail", "Action:Replace")
        if then is not None:
            then(run)
        assert run.wait_done(400) == "0", run.out + run.err
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
        for node in ("n2", "n3"):  # one at a time: a node with nothing to resume must not keep the other down
            with contextlib.suppress(Exception):
                slurm.set_node_state([node], "resume")
    return run


def assert_resumed_from_a_checkpoint(run: Run, expected: dict[int, str]) -> int:
    """The relaunch path's ranks restored the newest complete checkpoint and trained on from there to the end,
    every step after it once and in order; the final weights of every rank are the fault-free run's. The step
    restored from."""
    out = run.out
    restored = {int(r): int(s) for r, s in re.findall(r"^restored rank=(\d+) step=(\d+)$", out, re.MULTILINE)}
    assert set(restored) == {0, 1, 2, 3} and len(set(restored.values())) == 1, out
    k = restored[0]
    assert k > 0 and k % 5 == 0, out
    done = [int(s) for s in re.findall(r"^step=(\d+) ", out, re.MULTILINE)]
    resumed_at = len(done) - (STEPS - k)
    assert done[resumed_at:] == list(range(k + 1, STEPS + 1)), done  # from the checkpoint on, each step once
    assert digests(out) == expected, out
    return k


def test_a_second_fault_during_the_recovery_falls_back_to_the_last_checkpoint_with_the_fault_free_weights(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """n2 is replaced (Action:Replace) by the spare n3, whose ranks take 25 s to start; n3 is marked too while
    they do: the recovery into generation 2 has not formed, so the wrapper falls back (no third world built on a
    half-built one), relaunches every rank on n1 and n4, and they resume from the last checkpoint."""
    expected = reference(tmp_path / "reference", 0)
    config = tmp_path / "config.yaml"
    # No warm standby: a standby is up before the fault and joins at once (its rank was never slow to start), so the
    # second fault found generation 2 formed whenever the standbys had warmed up in time.
    config.write_text('autoresume:\n  full_node_check_s: 0.5\n  standby: "off"\n')
    env = {"NEW_RANK_DELAY": "25", "HPRESILIENCE_CONFIG": str(config)}

    def second_fault(run: Run) -> None:
        wait_for(lambda: run.named("inprocess_replaced"), "the replacement's launch", 120)
        slurm.set_node_state(["n3"], "fail", "Action:Replace")

    run = run_replacing_n2(cluster, slurm, tmp_path, 2, env, then=second_fault)
    fallback = run.named("inprocess_fallback")
    assert len(fallback) == 1 and fallback[0]["generation"] == 2, fallback
    assert "a second fault (on n3)" in fallback[0]["why"] and "generation 2" in fallback[0]["why"], fallback
    assert [e["generation"] for e in run.named("inprocess_world_formed")] == [1]  # generation 2 never formed
    assert len(run.named("attempt_started")) == 1
    assert_resumed_from_a_checkpoint(run, expected)


def test_a_recovery_past_its_bound_falls_back_to_the_last_checkpoint_with_the_fault_free_weights(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """The replacement's ranks take 40 s to start and inprocess_recovery_s is 6: the new world has not formed
    when the bound passes, so the wrapper falls back, saying which bound."""
    expected = reference(tmp_path / "reference", 0)
    config = tmp_path / "config.yaml"
    # No warm standby: the cold replacement is the slow start this test is about (a standby is up before the fault).
    config.write_text('autoresume:\n  full_node_check_s: 0.5\n  inprocess_recovery_s: 6\n  standby: "off"\n')
    env = {"NEW_RANK_DELAY": "40", "HPRESILIENCE_CONFIG": str(config)}
    run = run_replacing_n2(cluster, slurm, tmp_path, 1, env)
    fallback = run.named("inprocess_fallback")
    assert len(fallback) == 1 and "did not form within 6 s" in fallback[0]["why"], fallback
    assert_resumed_from_a_checkpoint(run, expected)


def test_a_lost_shard_with_no_surviving_replica_falls_back_to_the_last_checkpoint_with_the_fault_free_weights(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Shards by node (SHARD_BLOCK=2: ranks 0,1 hold shard 0 on n1, ranks 2,3 shard 1 on n2): n2 is replaced
    by the spare, every rank of the new world sees that no survivor holds shard 1 and gives up (exit 86), and the
    wrapper falls back; the relaunch restores each rank's shard from the checkpoint. Each rank's final weights
    equal the fault-free run's (the two shards differ)."""
    expected = reference(tmp_path / "reference", 2)
    assert expected[0] == expected[1] != expected[2] == expected[3]
    run = run_replacing_n2(cluster, slurm, tmp_path, 1, {"SHARD_BLOCK": "2"})
    out = run.out
    gave_up = re.findall(r"^hpr-inprocess gave_up rank=(\d+) why=(.*)$", out, re.MULTILINE)
    assert gave_up and all("no survivor holds a replica of shard 1" in why for _, why in gave_up), out
    assert len(run.named("inprocess_replaced")) == 1
    fallback = run.named("inprocess_fallback")
    assert len(fallback) == 1 and "could not finish the in-process recovery" in fallback[0]["why"], fallback
    assert_resumed_from_a_checkpoint(run, expected)


def test_an_in_process_recovery_shows_in_the_jobs_ledger_as_one_attempt_with_the_recoverys_parts(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """The same job, pure DDP, through an Action:Replace it recovers from in place: the ledger the wrapper
    writes at the end counts one attempt (it counted none) and one restart of action `inprocess` whose parts
    (detect, replace, teardown, new world, state transfer, first step after) are rank 0's and the wrapper's
    measured times; no lost work, and the weights are the fault-free run's."""
    expected = reference(tmp_path / "reference", 0)
    run = run_replacing_n2(cluster, slurm, tmp_path, 1, {})
    assert not run.named("inprocess_fallback") and digests(run.out) == expected, run.out + run.err
    assert [e["generation"] for e in run.named("inprocess_world_formed")] == [1, 2]
    ledger = json.loads((run.state / f"{run.job_id}.ledger.json").read_text())
    assert ledger["attempts"] == 1 and ledger["ended"], ledger
    (restart,) = ledger["restarts"]
    assert restart["action"] == "inprocess" and restart["nodes"] == ["n2"] and restart["lost_s"] == 0.0, ledger
    parts = restart["parts"]
    assert set(parts) == {
        "detect_s",
        "replace_s",
        "teardown_s",
        "new_world_s",
        "state_transfer_s",
        "first_step_s",
        "recovery_s",
    }
    assert ledger["badput_s"]["inprocess_recovery"] > 0, ledger
    print(f"in-process recovery parts (s): {json.dumps(parts)}")
