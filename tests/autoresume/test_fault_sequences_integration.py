"""Faults that the main path must survive, on real devclusters: three node replacements in one job, a node
that dies outright under a hot-spare job with Slurm's default SlurmdTimeout, tasks that escape their step
(proctrack/pgid), and a requeue released by the controller at once."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from hpresilience.controller.loop import Controller
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_wrapper_integration import TRAINER, Run, finished_steps, processes_with, unique_token
from tests.conftest import TEST_BASE_PORT, require_slurm
from tests.controller.conftest import settings_for, start_controller, write_scripts  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration


def wait(probe: Callable[[], object], what: str, timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)
    return value


def test_three_faults_in_a_row_on_different_nodes_are_each_recovered_in_the_same_job(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, start_controller: Callable[[Controller], Controller]
) -> None:
    """(c) Default settings, no spares, the controller repairing what an operator marks: each fault shrinks
    the job and grows it back (into an idle node, then into a repaired one), three times in one job."""
    scripts = write_scripts(tmp_path / "scripts", cluster)
    start_controller(Controller(settings_for(scripts, tmp_path / "ctl", forced_down_after_s=60), slurm))
    run = Run(cluster, slurm, tmp_path, "", str(TRAINER), nodes=2, env={"TRAIN_STEPS": "200", "STEP_SLEEP": "0.1"})
    failed = []
    for fault in range(1, 4):
        run.wait_output(f"attempt={fault} ", timeout=60)
        start = run.named("attempt_started")[fault - 1]
        resumed = int(re.findall(rf"attempt={fault} .*resume_from=(\d+)", run.out)[0])
        run.wait_output(f"step={resumed + 3} ", timeout=60)
        batch_host = slurm.job(run.job_id).batch_host
        victim = next(n for n in start["nodes"].split(",") if n != batch_host)
        failed.append(victim)
        slurm.set_node_state([victim], "fail", "Action:Replace")
        wait(lambda: len(run.named("step_running")) >= fault, f"the relaunch after fault {fault}", 90)  # noqa: B023
    assert run.wait_done(120) == "0", run.err
    assert len(set(failed)) == 3
    assert len(run.named("allocation_grown")) == 3 and len(run.named("allocation_shrunk")) == 3
    assert not run.named("job_requeue_requested")
    assert [e["cause"] for e in run.named("fault_seen")] == ["hardware"] * 3
    assert finished_steps(run.out) == {"step=200"}
    assert slurm.job(run.job_id).restart_count == 0


@pytest.fixture(scope="module")
def pgid_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """3 nodes with Slurm's default SlurmdTimeout (300 s) and process tracking by process group."""
    require_slurm()
    cl = DevCluster(
        state_dir=tmp_path_factory.mktemp("pgid") / "cluster",
        nodes=3,
        base_port=TEST_BASE_PORT + 600,
        overrides={"SlurmdTimeout": "300"},
        accounting=False,
        proctrack="pgid",
    )
    cl.up(timeout=60)
    yield cl
    cl.down()


def kill_with(token: str, node: str | None = None) -> int:
    killed = 0
    for p in processes_with(token):
        with contextlib.suppress(psutil.Error):
            if node is None or p.environ().get("SLURMD_NODENAME") == node:
                p.kill()
                killed += 1
    return killed


def attempt_of(p: psutil.Process) -> str | None:
    with contextlib.suppress(psutil.Error):
        return p.environ().get("AUTORESUME_ATTEMPT")
    return None


def test_a_node_that_dies_outright_is_replaced_by_the_spare_long_before_slurmd_timeout(
    pgid_cluster: DevCluster, tmp_path: Path
) -> None:
    """(f) n2's slurmd and its task are killed at once (a kernel panic; nobody marks the node) under a 2-node
    step with a hot spare: the step is relaunched on the survivor and the spare within 10 s, although Slurm
    would call n2 down only after SlurmdTimeout (300 s here)."""
    slurm = pgid_cluster.client()
    token = unique_token()
    run = Run(
        pgid_cluster,
        slurm,
        tmp_path,
        "--auto-resume-spares=1",
        f"{TRAINER} {token}",
        nodes=3,
        env={"TRAIN_STEPS": "100000", "STEP_SLEEP": "0.2"},
    )
    try:
        run.wait_output("step=3 ")
        assert run.named("attempt_started")[0]["nodes"] == "n1,n2"
        killed_at = time.time()
        assert pgid_cluster.kill_node("n2")
        assert kill_with(token, "n2") >= 1
        wait(lambda: run.named("step_running"), "the relaunch", 60)
        # Far below SlurmdTimeout (300 s here), with room for a loaded CI machine; bench figures give the speed.
        assert run.named("step_running")[0]["time"] - killed_at <= 60
        assert run.named("attempt_started")[1]["nodes"] == "n1,n3"
        fault = run.named("fault_seen")[-1]
        assert fault["cause"] == "hardware" and fault["nodes"] == "n2"
        # Found dead by whichever look came first: the probe after the step died of a signal, or the silence
        # watch (its output stopped while n1's went on); either way n2 did not answer.
        probes = run.named("nodes_probed") + run.named("silent_nodes_probed")
        assert "n2" in [p["unanswering"] for p in probes], probes
        # step_running is srun's start: the relaunched ranks' first line may come a moment later under load.
        first_line = wait(lambda: re.search(r"attempt=2 .*resume_from=(\d+)\n", run.out), "attempt 2's first line")
        assert isinstance(first_line, re.Match)
        resumed = int(first_line.group(1))
        run.wait_output(f"step={resumed + 2} ", timeout=20)
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
        kill_with(token)
        pgid_cluster.start_node("n2")


def test_a_task_that_escaped_its_step_is_killed_before_the_relaunch(pgid_cluster: DevCluster, tmp_path: Path) -> None:
    """Under proctrack/pgid a child in a session of its own (as torchrun's workers are) outlives the
    cancelled step: it is found by the job's marker, killed and reported before the next attempt starts."""
    slurm = pgid_cluster.client()
    wait(lambda: all(n.is_idle for n in slurm.nodes()), "an idle cluster", 60)
    token = unique_token()
    run = Run(
        pgid_cluster,
        slurm,
        tmp_path,
        "--auto-resume-spares=1",
        str(TRAINER),
        nodes=3,
        env={"TRAIN_STEPS": "30", "STEP_SLEEP": "0.2", "ORPHAN": token},
    )
    try:
        run.wait_output("step=3 ")
        assert len(processes_with(f"orphan-{token}")) == 2
        slurm.set_node_state(["n2"], "fail", "Action:Replace")
        assert run.wait_done(90) == "0", run.err
        first_relaunch = run.named("attempt_started")[1]["time"]
        killed = [k for k in run.named("stale_task_killed") if k["time"] < first_relaunch]
        assert sum(f"orphan-{token}" in k["command"] for k in killed) == 2  # one per node of attempt 1
        # Attempt 2's own orphans hold srun's output after its tasks end: that silence is no hang.
        assert not run.named("hang_detected") and len(run.named("attempt_started")) == 2
        left = [p for p in processes_with(f"orphan-{token}") if attempt_of(p) == "1"]
        assert not left, [p.cmdline() for p in left]
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
        kill_with(token)
        kill_with(f"orphan-{token}")
        with contextlib.suppress(Exception):
            slurm.set_node_state(["n2"], "resume")


def test_a_step_whose_tasks_ended_while_an_escaped_process_holds_its_output_ends_and_is_not_hung(
    pgid_cluster: DevCluster, tmp_path: Path
) -> None:
    """Hang detection on by default, a floor of 5 s: the tasks finish, but a process that escaped the step
    (setsid; proctrack/pgid) keeps srun's output open, so srun would wait silently for EioTimeout (60 s). The
    wrapper counts the step's tasks before calling the silence a hang, finds none, reaps the escaped
    processes and the step ends with its own exit code: one attempt, no hang, long before EioTimeout."""
    slurm = pgid_cluster.client()
    wait(lambda: all(n.is_idle for n in slurm.nodes()), "an idle cluster", 60)
    token = unique_token()
    config = tmp_path / "config.yaml"
    config.write_text("autoresume:\n  full_node_check_s: 0.5\n  hang_floor_s: 5\n")
    run = Run(
        pgid_cluster,
        slurm,
        tmp_path,
        "",
        str(TRAINER),
        nodes=2,
        env={"TRAIN_STEPS": "8", "STEP_SLEEP": "0.2", "ORPHAN": token, "HPRESILIENCE_CONFIG": str(config)},
    )
    try:
        run.wait_output("training finished", timeout=60)
        finished = time.time()
        assert run.wait_done(40) == "0", run.err
        ended = run.named("step_tasks_ended")
        assert len(ended) == 1 and ended[0]["threshold_s"] == 5
        assert not run.named("hang_detected") and len(run.named("attempt_started")) == 1
        killed = run.named("stale_task_killed")
        assert sum(f"orphan-{token}" in k["command"] for k in killed) == 2
        assert run.named("job_step_succeeded")[0]["time"] - finished < 30  # not EioTimeout's 60 s
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
        kill_with(token)
        kill_with(f"orphan-{token}")
