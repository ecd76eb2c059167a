"""Recovery without rollback on the devcluster (`--auto-resume-mode=inprocess`, issue 33): a data-parallel job
with no checkpointing at all loses a training node and goes on with the survivors' processes and state."""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import pytest

from hpresilience.slurm.client import SlurmClient
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


def test_an_operators_replace_keeps_the_survivors_processes_and_the_weights_equal_the_fault_free_runs(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """2 training nodes x 2 ranks + 1 spare, no checkpoint anywhere. `scontrol update node=n2 state=fail
    reason=Action:Replace` mid-run: only n2's step is cancelled, the spare's step joins the new world, the
    survivors on n1 keep their PIDs, the new ranks say they got their state from rank 0, no step is done twice,
    and the final weights equal, bit for bit, those of the same training run with no fault."""
    reference = fault_free_digest(tmp_path / "reference", 4, STEPS)
    (tmp_path / "job").mkdir()
    run = Run(
        cluster,
        slurm,
        tmp_path / "job",
        "--auto-resume-mode=inprocess --auto-resume-spares=1",
        f"--ntasks-per-node=2 --overcommit python {TRAIN}",
        nodes=3,
        env={"TRAIN_STEPS": str(STEPS), "STEP_SLEEP": "0.15", "HPR_WORLD_WAIT_S": "120"},
    )
    try:
        run.wait_output("step=10 ", timeout=180)
        first = {int(j["rank"]): j for j in joined(run.out) if j["generation"] == "1"}
        written = run.named("inprocess_world_written")
        assert written[0]["nodes"] == "n1,n2" and written[0]["world_size"] == 4
        assert slurm.job(run.job_id).batch_host == "n1"
        faulted_at = time.time()
        slurm.set_node_state(["n2"], "fail", "Action:Replace")
        wait_for(lambda: len([j for j in joined(run.out) if j["generation"] == "2"]) == 4, "the new world", 240)
        back_at = max(float(j["at"]) for j in joined(run.out) if j["generation"] == "2")
        assert run.wait_done(240) == "0", run.out + run.err
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
        with contextlib.suppress(Exception):
            slurm.set_node_state(["n2"], "resume")
    out = run.out
    second = {int(j["rank"]): j for j in joined(out) if j["generation"] == "2"}
    # The survivors (ranks 0, 1 on n1) are the same processes; the spare n3 took n2's slot (ranks 2, 3).
    assert [second[r]["pid"] for r in (0, 1)] == [first[r]["pid"] for r in (0, 1)], out
    assert [second[r]["state_from"] for r in (2, 3)] == ["0", "0"], out
    replaced = run.named("inprocess_replaced")
    assert len(replaced) == 1 and replaced[0]["replaced"] == "n2" and replaced[0]["nodes"] == "n1,n3"
    assert not run.named("inprocess_fallback") and not run.named("attempt_started")
    # Every step once, in order: nothing rolled back (at most the step in flight was abandoned and done again).
    done = [int(s) for s in re.findall(r"^step=(\d+) ", out, re.MULTILINE)]
    assert done == list(range(1, STEPS + 1)), done
    final = digests(out)
    assert len(final) == 4 and set(final.values()) == {reference}, out
    print(f"in-process recovery: fault -> every rank training again {back_at - faulted_at:.2f} s")
