"""Wrong, not dead, on the devcluster (gloo, 2 ranks per node, data parallel; examples/train_checked.py): a bit
flipped in one rank's weights is named (rank and node) within the check interval, its node marked Action:Replace
and swapped for the spare, and the job ends with a fault-free run's weights; a NaN loss with loss_policy
rollback resumes before it, skips the window and completes; with stop it ends with a one-line reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.scenarios import BASE_CONFIG, CHECK_EVERY, FLIP_STEP, NAN_STEP, Scenario, run_scenario

pytestmark = pytest.mark.integration


def test_sdc_a_flipped_bit_is_named_its_node_marked_and_the_job_ends_with_the_fault_free_weights(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    sc = Scenario(cluster, tmp_path, print, timeout=240)
    ok, line = run_scenario("sdc", sc)
    victim = cluster.names()[1]
    assert ok, line
    assert line.startswith(f"scenario sdc: ok node={victim} rank=3 detected_after_steps=")
    job = next(j for j in sc.jobs if j.name == "sdc")
    named = job.events("replica_disagreement")
    assert [e["node"] for e in named] == [victim, victim] and all(e["step"] == 30 for e in named)
    assert named[0]["restore_max_step"] == 20 and CHECK_EVERY * 2 < FLIP_STEP < 30
    assert "Action:Replace" in slurm.node(victim).reason and "rank 3" in slurm.node(victim).reason
    reference = next(j for j in sc.jobs if j.name == "sdc-reference")  # a healthy run triggers neither check
    assert not any(reference.events(e) for e in ("replica_disagreement", "integrity_rollback", "integrity_stop"))
    relaunched = job.events("attempt_started")
    assert len(relaunched) == 3 and victim not in relaunched[-1]["nodes"].split(",")


def test_nan_rollback_resumes_before_the_bad_step_skips_its_window_and_completes(
    cluster: DevCluster, tmp_path: Path
) -> None:
    sc = Scenario(cluster, tmp_path, print, timeout=240)
    ok, line = run_scenario("nan", sc)
    assert ok, line
    assert line == f"scenario nan: ok rolled_back_to=20 skipped={NAN_STEP - 1}-{NAN_STEP} completed=yes"
    job = sc.jobs[0]
    assert f"skipped step={NAN_STEP}" in job.out and "training finished step=40" in job.out


def test_nan_with_loss_policy_stop_ends_the_job_with_a_one_line_reason_and_no_relaunch(
    cluster: DevCluster, tmp_path: Path
) -> None:
    sc = Scenario(cluster, tmp_path, print, timeout=240)
    job = sc.submit("stop", cluster.names()[:2], BASE_CONFIG, f"--nan-step {NAN_STEP}")
    assert sc.finish(job) == "FAILED"
    lines = [ln for ln in job.err.splitlines() if ln.startswith("[hpresilience] training stopped")]
    # Every rank reports the NaN; whichever the wrapper read first is named.
    assert len(lines) == 1 and re.fullmatch(
        rf"\[hpresilience\] training stopped: loss is nan at step {NAN_STEP} \(rank\d on n[12]\); loss_policy stop",
        lines[0],
    ), job.err[-2000:]
    assert len(job.events("attempt_started")) == 1
    assert job.events("job_step_given_up")[0]["cause"] == "diverged"
