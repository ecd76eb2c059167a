"""The hang, straggler and elastic cases of the sick-node tests with real all-reduces across separate hosts (issue
36, point 3): a netns cluster (each node its own network and PID namespace), synchronous gloo training where only
rank 0 prints (tests/autoresume/data/train_sync.py), submitted with sbatch and the srun shim as a user would. The
partition case is test_partition_integration.py's.

Under synchronous training no node's output runs ahead of another's: a stopped rank silences the whole step, and
a slow node makes every rank as slow. What still tells the nodes apart: the stopped process's state (the hang's
attribution), and each rank's own work time (hpresilience.torch's `heartbeat.working()`), not its step time."""

from __future__ import annotations

import contextlib
import re
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hpresilience.testing import nodecpu
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.netns import Isolation
from tests.autoresume.test_partition_integration import TRAIN_SYNC, Job, wait_idle
from tests.autoresume.test_recipe_integration import job_notices
from tests.autoresume.test_slow_node_integration import need_cpu_cgroup
from tests.conftest import TEST_BASE_PORT, require_slurm
from tests.testing.test_netns_integration import need_netns

pytestmark = pytest.mark.integration
PORT = TEST_BASE_PORT + 675  # between the partition module's cluster (+650..+664) and the netns module's (+700)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    need_netns()
    cl = DevCluster(
        state_dir=tmp_path_factory.mktemp("collectives") / "cluster", nodes=3, base_port=PORT, isolation=Isolation.NETNS
    )
    cl.up(timeout=60)
    yield cl
    cl.down()


def job_of(cl: DevCluster, tmp: Path, srun: str, config: str, **env: str) -> Job:
    (tmp / "config.yaml").write_text("autoresume:\n" + config)
    script = f"#!/bin/bash\nsrun --auto-resume=1 {srun} {sys.executable} {TRAIN_SYNC}\necho wrapper_rc=$?\n"
    return Job(cl, tmp, script, {"HPRESILIENCE_CONFIG": str(tmp / "config.yaml"), **env}, "-N3")


def rank_process(job_id: int, rank: int) -> psutil.Process | None:
    """The training process of `rank` in the job's current step."""
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            env = p.environ()
            ours = env.get("HPR_AUTORESUME_JOB") == str(job_id) and env.get("SLURM_PROCID") == str(rank)
            if ours and any(a.endswith("train_sync.py") for a in p.cmdline()):
                return p
    return None


def kill_leftovers(job_id: int) -> None:
    """A stopped rank may outlive its cancelled step."""
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get("HPR_AUTORESUME_JOB") == str(job_id):
                p.kill()


def test_a_rank_stopped_under_synchronous_gloo_is_declared_hung_its_node_named_and_the_step_relaunched(
    hosts: DevCluster, tmp_path: Path
) -> None:
    """Rank 1 SIGSTOPped: every rank blocks in the all-reduce, the whole step goes silent; every node still
    answers the stall watch's probe (not a partition), so the hang detector declares it (a 10 s floor here, 60 s
    by default), the stopped process names its node, and the step goes again on the spare in the same job."""
    slurm = hosts.client()
    wait_idle(hosts, slurm)
    job = job_of(hosts, tmp_path, "--auto-resume-spares=1 -N2", "  hang_floor_s: 10\n", HEARTBEAT="1")
    victim = ""
    try:
        job.wait(lambda: 5 in job.steps(), "step 5", 90)
        rank1 = job.wait(lambda: rank_process(job.job_id, 1), "rank 1's process")
        victim = rank1.environ()["SLURMD_NODENAME"]
        assert victim != slurm.job(job.job_id).batch_host
        rank1.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        detected = job.wait(lambda: job.named("hang_detected"), "hang_detected", 60)[0]
        attributed = job.wait(lambda: job.named("hang_attributed"), "hang_attributed")[0]
        running = job.wait(lambda: job.named("step_running"), "the relaunch", 60)[0]
        print(
            f"rank 1 on {victim} stopped -> hang declared {detected['time'] - stopped_at:.1f} s, "
            f"step running again {running['time'] - stopped_at:.1f} s"
        )
        probed = job.named("silent_step_probed")
        assert probed and not any(e.get("unanswering") for e in probed), probed  # looked at, every node answered
        assert 10 <= detected["silent_s"] < 11 and detected["time"] - stopped_at < 15, detected
        assert attributed["node"] == victim and attributed["rank"] == "1" and attributed["unambiguous"] is True
        assert "stopped" in attributed["why"], attributed
        assert victim not in job.named("attempt_started")[1]["nodes"].split(",")
        marked = job.wait(lambda: job.named("suspect_node_marked"), "the mark")[0]
        assert marked["node"] == victim and "Action:Reboot" in slurm.node(victim).reason
        m = job.wait(lambda: re.search(r"^resumed from step (\d+)$", job.out, re.MULTILINE), "the resume")
        job.wait(lambda: max(job.steps()) > int(m.group(1)) + 1, "training on the spare")
        assert slurm.job(job.job_id).restart_count == 0 and not job.named("job_requeue_requested")
    finally:
        slurm.cancel(job.job_id)
        kill_leftovers(job.job_id)
        if victim and job.named("suspect_node_marked"):
            slurm.set_node_state([victim], "resume")  # marked Action:Reboot: back in service for the next test


def test_a_node_at_a_twentieth_of_a_cpu_under_synchronous_gloo_is_flagged_by_its_work_time_not_its_step_time(
    hosts: DevCluster, tmp_path: Path
) -> None:
    """Each rank burns 0.05 s of its own CPU per step before the all-reduce, then one node's cgroup gets 5 % of a
    CPU. Every rank then waits for that node in the all-reduce: their wall step times stay alike (the rank files
    show it), so the step time cannot name it, and only rank 0 prints; the work time the ranks report through
    `heartbeat.working()` does, and the straggler watch flags that node (2 s windows here, 10 s by default)."""
    need_cpu_cgroup()
    slurm = hosts.client()
    wait_idle(hosts, slurm)
    config = "  straggler_window_s: 2\n  heartbeat_every_s: 0.5\n"
    job = job_of(hosts, tmp_path, "-N2", config, HEARTBEAT="1", CPU_WORK="0.05", STEP_SLEEP="0.1")
    victim = ""
    try:
        job.wait(lambda: 3 in job.steps(), "step 3", 90)
        nodes = job.named("attempt_started")[0]["nodes"].split(",")
        victim = next(n for n in nodes if n != slurm.job(job.job_id).batch_host)  # the wrapper's node keeps its CPU
        hosts.slow(victim, cpu=0.05)
        slowed_at, slowed_step = time.time(), max(job.steps())
        flagged = job.wait(lambda: job.named("straggler_detected"), "straggler_detected", 60)
        took = flagged[0]["time"] - slowed_at
        print(f"{victim} at 0.05 CPU under sync gloo: flagged after {took:.1f} s, work ratio {flagged[0]['ratio']}")
        assert [f["node"] for f in flagged] == [victim] and flagged[0]["ratio"] > 1.2
        # What each rank saw since the quota: the same wall time per step (synchronous), not the same work.
        rows = {
            r: [line.split() for line in (tmp_path / "ckpt" / f"times-rank{r}.txt").read_text().splitlines()]
            for r in (0, 1)
        }
        slow_rank = nodes.index(victim)
        wall = {r: statistics.median(float(w) for s, w, _ in v if int(s) > slowed_step + 1) for r, v in rows.items()}
        work = {r: statistics.median(float(k) for s, _, k in v if int(s) > slowed_step + 1) for r, v in rows.items()}
        print(f"since the quota: wall s/step {wall}, work s/step {work} (slow rank {slow_rank})")
        assert wall[slow_rank] / wall[1 - slow_rank] < 1.2, wall  # the step time cannot tell them apart
        assert work[slow_rank] / work[1 - slow_rank] > 2, work
    finally:
        if victim:
            hosts.slow(victim, cpu=1)
        slurm.cancel(job.job_id)
    assert nodecpu.quota(hosts.base_port, victim) is None


def test_with_min_nodes_a_lost_node_leaves_the_gloo_step_training_short_then_it_grows_back(
    hosts: DevCluster, tmp_path: Path
) -> None:
    """3 nodes, --auto-resume-min-nodes=2, no spare: Action:Replace on one node relaunches the step on the other
    two (world 2, real all-reduces between them, from the checkpoint); once the node is resumed the step moves
    back to 3 nodes (world 3) in the same job. train_sync.py does not watch the move notice: move_grace_s 1
    stops it and it resumes from its every-step checkpoint."""
    slurm = hosts.client()
    wait_idle(hosts, slurm)
    job = job_of(hosts, tmp_path, "--auto-resume-min-nodes=2", "  move_grace_s: 1\n", STEP_SLEEP="0.3")
    victim = ""
    try:
        job.wait(lambda: 4 in job.steps(), "step 4", 90)
        now = slurm.job(job.job_id)
        victim = [n for n in now.nodes if n != now.batch_host][-1]
        with job_notices(slurm):
            failed_at = time.time()
            slurm.set_node_state([victim], "fail", "Action:Replace")
            short = job.wait(lambda: job.named("step_running"), "the step on the healthy nodes")[0]
            assert job.named("running_short")[0]["nodes_now"] == 2
            assert victim not in job.named("attempt_started")[-1]["nodes"].split(",")
            resumed = job.wait(lambda: job.out.count("resumed from step") >= 1, "the short step's resume") and max(
                job.steps()
            )
            job.wait(lambda: max(job.steps()) >= resumed + 3, "training on 2 nodes")
            assert re.findall(r"^world (\d+)$", job.out, re.MULTILINE) == ["3", "2"], job.out
            slurm.set_node_state([victim], "resume")
            resumed_at = time.time()
            moved = job.wait(lambda: job.named("step_moved"), "the move back to 3 nodes", 60)[0]
            assert moved["nodes_now"] == 3 and victim in moved["nodes"].split(",")
            job.wait(lambda: job.out.count("resumed from step") >= 2, "the full step's resume")
            back = max(job.steps())
            job.wait(lambda: max(job.steps()) >= back + 3, "training on 3 nodes")
        print(
            f"{victim} failed -> step on 2 nodes {short['time'] - failed_at:.1f} s "
            f"(restart latency {short['restart_latency_s']:.2f} s); resumed -> moved back to 3 nodes "
            f"{moved['time'] - resumed_at:.1f} s"
        )
        # Each attempt's all-reduces summed over its own world (train_sync.py asserts the sum every step).
        assert re.findall(r"^world (\d+)$", job.out, re.MULTILINE) == ["3", "2", "3"], job.out
        assert len(job.named("policy_decided")) == 1  # the move back is not a restart
        assert not job.named("job_requeue_requested") and slurm.job(job.job_id).restart_count == 0
    finally:
        slurm.cancel(job.job_id)
        if victim:
            with contextlib.suppress(Exception):
                slurm.set_node_state([victim], "resume")
