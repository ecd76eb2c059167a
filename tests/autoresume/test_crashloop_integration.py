"""Crash loops on the devcluster (decide/crashloop.py): real sbatch jobs whose trainer crashes at a step with a
traceback on stderr, relaunched by the wrapper under `retryOnApplicationError: true`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_wrapper_integration import TRAINER, Run, finished_steps

pytestmark = pytest.mark.integration


def retry_policy(tmp: Path) -> str:
    p = tmp / "policy.yaml"
    p.write_text(json.dumps({"runPolicy": {"retryOnApplicationError": True}}))  # JSON is YAML
    return str(p)


def test_a_crash_at_step_40_every_attempt_stops_after_the_bound_on_different_nodes_with_no_node_marked(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Checkpoint every 10 steps, crash at step 40 every time: attempts 1 and 2 fail at step 40 on the same nodes,
    the third is moved to the spare and fails the same way: crash_loop_stopped after 3, exit code 1, every node
    still in service, the ledger ends with a stop."""
    run = Run(
        cluster,
        slurm,
        tmp_path,
        f"--auto-resume-rules={retry_policy(tmp_path)} --auto-resume-spares=1",
        str(TRAINER),
        nodes=3,
        env={"TRAIN_STEPS": "60", "CRASH_AT": "40", "CKPT_EVERY": "10", "STEP_SLEEP": "0.05"},
    )
    assert run.wait_done(timeout=150) == "1", run.err
    starts = run.named("attempt_started")
    assert len(starts) == 3, [e["event"] for e in run.events()]
    assert starts[0]["nodes"] == starts[1]["nodes"] != starts[2]["nodes"]
    assert len(run.named("step_moved_off_crash")) == 1
    stopped = run.named("crash_loop_stopped")
    # Step 40: the failing task's last step, read from its own traceback ("... at step 40 on ...").
    assert len(stopped) == 1 and stopped[0]["stopped_after"] == 3 and stopped[0]["step"] == 40
    assert stopped[0]["nodes_differ"] is True and stopped[0]["nodes_marked"] == 0
    assert "RuntimeError: loss exploded at step # on" in stopped[0]["tail"][-1]
    assert [e["cause"] for e in run.named("fault_seen")] == ["application", "application", "crash_loop"]
    assert run.named("job_step_given_up")[0]["cause"] == "crash_loop"
    assert not run.named("suspect_node_marked") and not run.named("crash_suspect_node")
    for n in slurm.known_nodes(cluster.names()):
        assert "hpr-" not in n.reason, (n.name, n.reason)
    ledger = json.loads((run.state / f"{run.job_id}.ledger.json").read_text())
    assert [(r["cause"], r["action"]) for r in ledger["restarts"]][-1] == ("crash_loop", "stop")
    assert "crash_loop on - -> stop" in run.out


def test_the_same_crash_at_different_steps_on_the_same_node_makes_it_a_suspect(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Rank 1 crashes the same way at step 12, then at step 31 (its node fails first both times): that node is a
    suspect in the events (not marked: 2 of the 3 steps marking needs); the third attempt finishes."""
    run = Run(
        cluster,
        slurm,
        tmp_path,
        f"--auto-resume-rules={retry_policy(tmp_path)}",
        str(TRAINER),
        nodes=2,
        env={"TRAIN_STEPS": "40", "CRASH_AT_BY_ATTEMPT": "12 31", "CRASH_RANK": "1", "STEP_SLEEP": "0.05"},
    )
    assert run.wait_done(timeout=150) == "0", run.err
    node_of_rank1 = run.named("attempt_started")[0]["nodes"].split(",")[1]
    suspects = run.named("crash_suspect_node")
    assert len(suspects) == 1, run.events()
    assert suspects[0]["node"] == node_of_rank1 and sorted(suspects[0]["steps"]) == [12, 31]
    assert not run.named("crash_loop_stopped") and not run.named("suspect_node_marked")
    assert finished_steps(run.out) == {"step=40"}


def test_a_replayed_step_whose_loss_differs_from_before_the_fault_is_reported(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Attempt 1 prints loss 2.0 and crashes at step 12 (checkpoint every 5); attempt 2 resumes from step 10 and
    redoes step 11 with loss 1.0: restore_loss_mismatch names the step and both losses; the job finishes."""
    run = Run(
        cluster,
        slurm,
        tmp_path,
        f"--auto-resume-rules={retry_policy(tmp_path)}",
        str(TRAINER),
        nodes=2,
        env={"TRAIN_STEPS": "15", "CRASH_AT_BY_ATTEMPT": "12", "CKPT_EVERY": "5", "LOSS_SEQ": "2.0"},
    )
    assert run.wait_done(timeout=150) == "0", run.err
    found = run.named("restore_loss_mismatch")
    assert len(found) == 1 and found[0]["attempt"] == 2, run.events()
    got = {(m["step"], m["before"], m["now"]) for m in found[0]["mismatched"]}
    # Rank 1 may have printed step 12 too before srun ended it: the same difference, one step later.
    assert (11, 2.0, 1.0) in got and got <= {(11, 2.0, 1.0), (12, 2.0, 1.0)}


def test_megatrons_exit_16_is_rerun_off_the_node_that_failed_under_the_default_policy(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Exit code 16 (resume to disambiguate) is a requested rerun, not an application error: relaunched even
    though the default policy retries no application error, onto the spare in place of the node that failed."""
    run = Run(
        cluster,
        slurm,
        tmp_path,
        "--auto-resume-spares=1",
        str(TRAINER),
        nodes=3,
        env={"TRAIN_STEPS": "10", "CRASH_AT_BY_ATTEMPT": "5", "CRASH_EXIT": "16", "STEP_SLEEP": "0.05"},
    )
    assert run.wait_done(timeout=150) == "0", run.err
    starts = [e["nodes"].split(",") for e in run.named("attempt_started")]
    # Rank 0 failed first: its node made way for the spare, rank 1's node stayed.
    assert len(starts) == 2 and starts[1][0] not in starts[0] and starts[1][1] == starts[0][1]
    assert len(run.named("step_moved_off_crash")) == 1
    assert run.named("rerun_requested")[0]["exit_code"] == 16
    assert run.named("fault_seen")[0]["cause"] == "rerun"
    assert finished_steps(run.out) == {"step=10"}
