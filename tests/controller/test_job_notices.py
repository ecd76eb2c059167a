"""The controller's job thread, counted through the command runner on the real devcluster (not a dry run: the
thread that tells jobs and releases requeued ones is on): what it reads when all is well, what it writes
when a node under a running job is marked bad, and what the wrapper then reads of its own job."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpresilience.autoresume.nodewatch import NodeWatch
from hpresilience.controller.loop import Controller
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.notice import read_notice
from hpresilience.slurm.runner import CountingRunner
from hpresilience.testing.devcluster import DevCluster
from tests.controller.conftest import Scripts, settings_for

pytestmark = pytest.mark.integration
LIST_OUT_OF_SERVICE = "sinfo -h -N -R -o %N"


def counting(cl: DevCluster) -> tuple[SlurmClient, CountingRunner]:
    runner = CountingRunner.like(cl.client().runner)
    client = SlurmClient(runner)
    assert client.version
    runner.calls.clear()
    return client, runner


def test_job_thread_tells_the_job_on_a_bad_node_and_never_reads_the_pending_queue(
        cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path) -> None:
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    pending = slurm.sbatch("-N4", "--begin=now+1hour", "-o", "/dev/null", "--wrap", "true")
    client, runner = counting(cluster)
    ctl = Controller(settings_for(scripts, tmp_path / "state", release_scan_every_s=3600), client)
    ctl.jobs_tick(time.monotonic())
    assert runner.commands() == [LIST_OUT_OF_SERVICE]  # all well: one short listing, no job read at all
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    runner.calls.clear()
    ctl.jobs_tick(time.monotonic() + 10)
    cmds = runner.commands()
    assert cmds[:4] == [LIST_OUT_OF_SERVICE, "scontrol show node n2 -o",
                        "squeue -h -t R,CG,S -w n2 -o %i|%N", f"scontrol show job {job_id}"]
    assert cmds[4].startswith(f"scontrol update jobid={job_id} AdminComment=hpr:bad=n2@")
    assert cmds[5:] == [f"squeue -h -j {job_id} -t PD -o %i|%r|%k"]  # the release: the told job only
    assert not any(c.startswith("squeue -h -t PD") for c in cmds) and str(pending) not in " ".join(cmds)
    assert set(read_notice(slurm, job_id).bad) == {"n2"}
    runner.calls.clear()
    ctl.jobs_tick(time.monotonic() + 20)  # nothing changed: no job is read or written again
    assert runner.commands() == [LIST_OUT_OF_SERVICE, "scontrol show node n2 -o",
                                 f"squeue -h -j {job_id} -t PD -o %i|%r|%k"]
    slurm.set_node_state(["n2"], "resume")
    runner.calls.clear()
    ctl.jobs_tick(time.monotonic() + 30)  # back in service: the word comes off
    assert read_notice(slurm, job_id).bad == {}


def test_the_wrapper_reads_its_own_job_each_poll_and_the_nodes_only_on_a_notice(
        cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path) -> None:
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    client, runner = counting(cluster)
    watch = NodeWatch(client, job_id, full_check_s=3600)
    for _ in range(3):
        assert watch.bad_nodes(["n1", "n2"]) == []
    assert runner.commands() == [f"scontrol show job {job_id}"] * 3
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    assert watch.bad_nodes(["n1", "n2"]) == []  # Slurm knows, nobody told the job: not read (no full check due)
    Controller(settings_for(scripts, tmp_path / "state"), slurm).notify_jobs()
    runner.calls.clear()
    assert [n.name for n in watch.bad_nodes(["n1", "n2"])] == ["n2"]
    assert runner.commands() == [f"scontrol show job {job_id}", "scontrol show node n[1-2] -o"]
    runner.calls.clear()
    watch.bad_nodes(["n1", "n2"])  # the same mark is not news twice
    assert runner.commands() == [f"scontrol show job {job_id}"]


def test_without_a_controller_the_wrapper_reads_its_nodes_every_full_check(
        cluster: DevCluster, slurm: SlurmClient) -> None:
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    client, runner = counting(cluster)
    watch = NodeWatch(client, job_id, full_check_s=0.5)
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    assert watch.bad_nodes(["n1", "n2"]) == []
    time.sleep(0.6)
    assert [n.name for n in watch.bad_nodes(["n1", "n2"])] == ["n2"]
    assert runner.commands() == [f"scontrol show job {job_id}"] * 2 + ["scontrol show node n[1-2] -o"]
