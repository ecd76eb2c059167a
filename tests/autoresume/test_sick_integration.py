"""Sick, not dead, on the devcluster with HyperPod's documented recipe (torchrun on gloo, no rules, no
spares), default thresholds unless said: a SIGSTOPped rank is declared hung within a minute of the last
progress line, its node named and the step relaunched in the same job; an NCCL watchdog abort is
relaunched on the same nodes; a rank 30 % slower is flagged as a straggler within a minute; a healthy job
that logs every 20 s is never declared hung."""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_recipe_integration import STEPS, Recipe, reference_weight

pytestmark = pytest.mark.integration


def rank_process(job_id: int, rank: int) -> psutil.Process | None:
    """The training process of `rank` in the job's current step (torchrun's worker)."""
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            env = p.environ()
            if (
                env.get("HPR_AUTORESUME_JOB") == str(job_id)
                and env.get("RANK") == str(rank)
                and any(a.endswith(".py") and "train" in a for a in p.cmdline())
            ):
                return p
    return None


@pytest.fixture()
def leftovers() -> Iterator[list[int]]:
    """Job ids whose processes are killed at the end (a stopped rank may outlive a cancelled step)."""
    jobs: list[int] = []
    yield jobs
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get("HPR_AUTORESUME_JOB") in {str(j) for j in jobs}:
                p.kill()


def test_a_stopped_rank_is_declared_hung_within_a_minute_its_node_named_and_the_job_completes(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, leftovers: list[int]
) -> None:
    run = Recipe(cluster, tmp_path, inject=True)  # default settings: hang detection is on
    leftovers.append(run.job_id)
    run.wait(lambda: "step=8\n" in run.out, "step 8")
    victim = run.wait(lambda: rank_process(run.job_id, 1), "rank 1's process")
    victim_node = victim.environ()["SLURMD_NODENAME"]
    assert victim_node != slurm.job(run.job_id).batch_host
    victim.send_signal(signal.SIGSTOP)
    stopped_at = time.time()
    detected = run.wait(lambda: run.named("hang_detected"), "hang_detected", timeout=90)[0]
    # Declared once the silence passed hang_floor_s (60 s, the default): the time the wrapper saw no line.
    assert 60 <= detected["silent_s"] < 60.5, detected  # declared at the threshold, not a poll tick after
    assert detected["time"] - stopped_at < 62
    attributed = run.wait(lambda: run.named("hang_attributed"), "hang_attributed")[0]
    assert attributed["node"] == victim_node and attributed["rank"] == "1" and attributed["unambiguous"] is True, (
        attributed
    )
    assert "stopped" in attributed["why"]
    evidence = Path(attributed["evidence"])
    assert (evidence / "hang.json").exists() and (evidence / f"procs-{victim_node}.txt").exists()
    assert attributed["stacks"] >= 1  # rank 0 answered the stack request; its stack file is evidence
    assert next(iter(evidence.glob("stacks-rank0-*.txt"))).read_text().count("File ") > 0
    # Rank 0 dumped its flight recorder on request (it waits in the all-reduce); stopped rank 1 could not: behind.
    assert attributed["fr_dumps"] == 1 and attributed["fr_behind"] == "1", attributed
    marked = run.wait(lambda: run.named("suspect_node_marked"), "the mark")[0]
    node = slurm.node(victim_node)
    assert marked["node"] == victim_node and "Action:Reboot" in node.reason and "hang" in node.reason
    assert run.wait_finished() == pytest.approx(reference_weight(STEPS, 2), abs=1e-5)
    starts = run.named("attempt_started")
    assert len(starts) == 2 and victim_node not in starts[1]["nodes"].split(",")
    assert slurm.job(run.job_id).restart_count == 0  # relaunched in the same job, not requeued


def test_an_nccl_watchdog_abort_is_relaunched_on_the_same_nodes_and_the_job_completes(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, leftovers: list[int]
) -> None:
    run = Recipe(cluster, tmp_path, inject=True, extra_env={"INJECT_ABORT_RANK": "1", "INJECT_ABORT_STEP": "8"})
    leftovers.append(run.job_id)
    assert run.wait_finished() == pytest.approx(reference_weight(STEPS, 2), abs=1e-5)
    seen = run.named("collective_failure_seen")
    assert seen and seen[0]["kind"] in ("nccl_watchdog", "gloo_connection"), seen
    fault = run.named("fault_seen")
    assert [f["cause"] for f in fault] == ["collective"]
    starts = run.named("attempt_started")
    assert len(starts) == 2 and starts[0]["nodes"] == starts[1]["nodes"]
    run.wait(lambda: run.named("job_step_succeeded") or run.named("job_step_given_up"), "the wrapper's verdict")
    assert not run.named("job_step_given_up") and run.named("job_step_succeeded")
    # The user's output still has the watchdog's line; the heartbeat lines are not in it.
    assert "Watchdog caught collective operation timeout" in run.out and "[hpr-heartbeat]" not in run.out


def test_a_rank_30_percent_slower_is_flagged_as_a_straggler_within_a_minute(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, leftovers: list[int]
) -> None:
    run = Recipe(
        cluster, tmp_path, steps=400, inject=True, extra_env={"INJECT_SLOW_RANK": "1", "INJECT_SLOW_FACTOR": "1.3"}
    )
    leftovers.append(run.job_id)
    run.wait(lambda: "step=1\n" in run.out, "step 1", timeout=60)
    began = time.time()
    flagged = run.wait(lambda: run.named("straggler_detected"), "straggler_detected", timeout=75)
    slow_node = rank_process(run.job_id, 1)
    assert slow_node is not None
    assert [f["node"] for f in flagged] == [slow_node.environ()["SLURMD_NODENAME"]]
    assert flagged[0]["time"] - began < 60 and flagged[0]["ratio"] > 1.2
    slurm.cancel(run.job_id)


def test_a_healthy_job_logging_every_20_s_is_never_declared_hung(
    cluster: DevCluster, tmp_path: Path, leftovers: list[int]
) -> None:
    # A floor of 10 s: only the 10 x median interval rule (200 s) keeps this job alive, so the test fails
    # if hang detection ignored how often the job logs.
    config = tmp_path / "config.yaml"
    config.write_text("autoresume:\n  hang_floor_s: 10\n")
    run = Recipe(
        cluster, tmp_path / "job", steps=3, extra_env={"TRAIN_STEP_SLEEP": "20", "HPRESILIENCE_CONFIG": str(config)}
    )
    leftovers.append(run.job_id)
    run.wait(lambda: run.named("job_step_succeeded") or run.named("hang_detected"), "the end", timeout=150)
    assert not run.named("hang_detected") and run.named("job_step_succeeded")
    assert re.search(r"training finished step=3 ", run.out)
    assert len(run.named("attempt_started")) == 1


def test_with_exclude_stragglers_a_straggler_is_swapped_for_the_hot_spare_at_once(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Small windows (2 s) keep it short; the stand-in trainer's ranks print their own step lines, so the
    step times come from the output of each task (no heartbeats)."""
    from tests.autoresume.test_wrapper_integration import TRAINER, Run

    config = tmp_path / "config.yaml"
    config.write_text("autoresume:\n  exclude_stragglers: true\n  straggler_window_s: 2\n")
    (tmp_path / "job").mkdir()
    run = Run(
        cluster,
        slurm,
        tmp_path / "job",
        "--auto-resume-spares=1 --auto-resume-shutdown-timeout=1",
        str(TRAINER),
        nodes=3,
        env={
            "TRAIN_STEPS": "60",
            "STEP_SLEEP": "0.25",
            "SLOW_RANK": "1",
            "SLOW_SLEEP": "0.4",
            "HPRESILIENCE_CONFIG": str(config),
        },
    )
    assert run.wait_done(120) == "0", run.err
    flagged = run.named("straggler_detected")
    assert flagged and flagged[0]["node"] == "n2", run.events()
    swap = run.named("straggler_swap_now")[0]
    assert swap["node"] == "n2" and swap["spare"] == "n3"
    starts = run.named("attempt_started")
    assert [s["nodes"] for s in starts] == ["n1,n2", "n1,n3"]
    assert [f["cause"] for f in run.named("fault_seen")] == ["slow"]
    assert "rank=0 training finished step=60" in run.out
