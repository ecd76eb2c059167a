"""The controller's job thread, counted through the command runner on the real devcluster (not a dry run: the
thread that tells jobs and releases requeued ones is on): what it reads when all is well, what it writes
when a node under a running job is marked bad, and what the wrapper then reads of its own job."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpresilience.autoresume.watch import nodewatch
from hpresilience.autoresume.watch.nodewatch import NodeWatch
from hpresilience.controller.jobwords import LEASE_S, RENEW_EVERY_S
from hpresilience.controller.loop import Controller
from hpresilience.slurm.adminword import read_admin_word, running_batch_jobs
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.runner import CountingRunner
from hpresilience.testing.devcluster import DevCluster
from tests.conftest import held_read, node_read, notice_read, unmarked
from tests.controller.conftest import Scripts, settings_for

pytestmark = pytest.mark.integration
LIST_OUT_OF_SERVICE = "sinfo -h -N -R -o %N"
RUNNING_BATCH = "sacct -a -n -P -s R -o JobIDRaw,State"


def nudge_of(job_id: int) -> str:
    return f"scancel --signal={int(signal.SIGWINCH)} --full --batch {job_id}"


def counting(cl: DevCluster) -> tuple[SlurmClient, CountingRunner]:
    runner = CountingRunner.like(cl.client().runner)
    client = SlurmClient(runner)
    assert client.version
    runner.calls.clear()
    return client, runner


def test_job_thread_tells_the_job_on_a_bad_node_and_never_reads_the_pending_queue(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path
) -> None:
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    pending = slurm.sbatch("-N4", "--begin=now+1hour", "-o", "/dev/null", "--wrap", "true")
    client, runner = counting(cluster)
    ctl = Controller(settings_for(scripts, tmp_path / "state", release_scan_every_s=3600, watch_jobs_every_s=0), client)
    ctl.jobs_tick(time.monotonic())
    assert runner.commands() == [LIST_OUT_OF_SERVICE]  # all well: one short listing, no job read at all
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    runner.calls.clear()
    ctl.jobs_tick(time.monotonic() + 10)
    cmds = unmarked(runner.commands())
    assert cmds[:4] == [
        LIST_OUT_OF_SERVICE,
        node_read(cluster, "n2"),
        "squeue -h -t R,CG,S -w n2 -o %i|%N",
        notice_read(cluster, job_id),
    ]
    assert cmds[4].startswith(f"scontrol update jobid={job_id} AdminComment=hpr:bad=n2@")
    assert cmds[5:] == [
        nudge_of(job_id),  # its wrapper reads the notice now
        held_read(cluster, job_id),
    ]  # the release: the told job only
    assert not any(c.startswith("squeue -h -t PD") for c in cmds) and str(pending) not in " ".join(cmds)
    assert set(read_admin_word(slurm, job_id).bad) == {"n2"}
    runner.calls.clear()
    ctl.jobs_tick(time.monotonic() + 20)  # nothing changed: no job is read or written again
    assert unmarked(runner.commands()) == [
        LIST_OUT_OF_SERVICE,
        node_read(cluster, "n2"),
        held_read(cluster, job_id),
    ]
    slurm.set_node_state(["n2"], "resume")
    runner.calls.clear()
    ctl.jobs_tick(time.monotonic() + 30)  # back in service: the word comes off
    assert read_admin_word(slurm, job_id).bad == {}


def test_the_wrapper_reads_its_own_job_each_poll_and_the_nodes_only_on_a_notice(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path
) -> None:
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    client, runner = counting(cluster)
    watch = NodeWatch(client, job_id, full_check_s=3600)
    for _ in range(3):
        assert watch.bad_nodes(["n1", "n2"]) == []
    assert unmarked(runner.commands()) == [notice_read(cluster, job_id)] * 3
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    assert watch.bad_nodes(["n1", "n2"]) == []  # Slurm knows, nobody told the job: not read (no full check due)
    Controller(settings_for(scripts, tmp_path / "state", watch_jobs_every_s=0), slurm).notify_jobs()
    runner.calls.clear()
    assert [n.name for n in watch.bad_nodes(["n1", "n2"])] == ["n2"]
    assert unmarked(runner.commands()) == [notice_read(cluster, job_id), node_read(cluster, "n[1-2]")]
    runner.calls.clear()
    watch.bad_nodes(["n1", "n2"])  # the same mark is not news twice
    assert unmarked(runner.commands()) == [notice_read(cluster, job_id)]


def test_without_a_controller_the_wrapper_reads_its_nodes_every_full_check(
    cluster: DevCluster, slurm: SlurmClient
) -> None:
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    client, runner = counting(cluster)
    watch = NodeWatch(client, job_id, full_check_s=0.5)
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    assert watch.bad_nodes(["n1", "n2"]) == []
    time.sleep(0.6)
    assert [n.name for n in watch.bad_nodes(["n1", "n2"])] == ["n2"]
    assert unmarked(runner.commands()) == [notice_read(cluster, job_id)] * 2 + [node_read(cluster, "n[1-2]")]


def wait_in_accounting(slurm: SlurmClient, job_id: int) -> None:
    """slurmdbd learns of a batch step a moment after slurmctld starts it."""
    deadline = time.monotonic() + 20
    while job_id not in running_batch_jobs(slurm):
        assert time.monotonic() < deadline, f"job {job_id}'s batch step never showed in sacct"
        time.sleep(0.3)


def test_job_thread_leases_each_running_batch_job_from_accounting_once_per_renewal_and_not_salloc_jobs(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path
) -> None:
    job_id = slurm.sbatch("-N1", "-w", "n1", "-o", "/dev/null", "--wrap", "sleep 300")
    alloc = subprocess.Popen(
        ["salloc", "-N1", "-w", "n3", "--no-shell"],
        env=cluster.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        slurm.wait_running(job_id)
        wait_in_accounting(slurm, job_id)
        salloc_job = next(j.job_id for j in slurm.jobs() if j.job_id != job_id and j.state == "RUNNING")
        slurm.sbatch("-N4", "--begin=now+1hour", "-o", "/dev/null", "--wrap", "true")  # pending: never read
        client, runner = counting(cluster)
        ctl = Controller(
            settings_for(scripts, tmp_path / "state", watch_jobs_every_s=30, release_scan_every_s=3600), client
        )
        t0 = time.monotonic()
        ctl.jobs_tick(t0)
        cmds = unmarked(runner.commands())
        assert cmds[:3] == [LIST_OUT_OF_SERVICE, RUNNING_BATCH, notice_read(cluster, job_id)]
        assert cmds[3].startswith(f"scontrol update jobid={job_id} AdminComment=hpr:watch=")
        assert len(cmds) == 4 and str(salloc_job) not in " ".join(cmds)  # no batch step: nothing to nudge
        lease = read_admin_word(slurm, job_id).watched_until
        assert LEASE_S - 5 <= lease - time.time() <= LEASE_S
        assert read_admin_word(slurm, salloc_job).watched_until == 0
        runner.calls.clear()
        ctl.jobs_tick(t0 + 10)  # the watch pass is not due: one short listing
        assert runner.commands() == [LIST_OUT_OF_SERVICE]
        runner.calls.clear()
        ctl.jobs_tick(t0 + 40)  # due, but the lease is fresh: the listing from slurmdbd only, no job read
        assert runner.commands() == [LIST_OUT_OF_SERVICE, RUNNING_BATCH]
        ctl.notifier.leases[job_id] -= RENEW_EVERY_S + 1  # as if written RENEW_EVERY_S ago: renewed
        runner.calls.clear()
        ctl.jobs_tick(t0 + 80)
        cmds = unmarked(runner.commands())
        assert cmds[:3] == [LIST_OUT_OF_SERVICE, RUNNING_BATCH, notice_read(cluster, job_id)] and len(cmds) == 4
        assert cmds[3].startswith(f"scontrol update jobid={job_id} AdminComment=hpr:watch=")
    finally:
        alloc.terminate()
        alloc.wait(10)
        slurm.cancel(job_id)


def test_a_watched_wrapper_reads_its_job_only_when_nudged_or_at_the_safety_read_and_never_its_nodes(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path
) -> None:
    job_id = slurm.sbatch("-N2", "-w", "n1,n2", "--no-kill", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    wait_in_accounting(slurm, job_id)
    ctl = Controller(settings_for(scripts, tmp_path / "state", release_requeued_every_s=1), slurm)
    ctl.jobs_tick(time.monotonic())  # the lease
    client, runner = counting(cluster)
    watch = NodeWatch(client, job_id, full_check_s=0.3, watched_read_s=3600)
    assert watch.bad_nodes(["n1", "n2"]) == []
    # A lease: the wrapper sends itself the controller's nudge once, to see that it reaches it.
    assert unmarked(runner.commands()) == [notice_read(cluster, job_id), nudge_of(job_id)]
    for _ in range(2):  # the nudge has not come back (yet): still a read every poll, and the full check
        time.sleep(0.35)
        assert watch.bad_nodes(["n1", "n2"]) == [] and not watch.watched()
    watch.on_nudge()  # what the SIGWINCH handler does when the nudge arrives
    runner.calls.clear()
    assert watch.bad_nodes(["n1", "n2"]) == [] and watch.watched()
    assert unmarked(runner.commands()) == [notice_read(cluster, job_id)]
    runner.calls.clear()
    for _ in range(3):  # watched: no job read, and no node read however long since the last full check
        time.sleep(0.35)
        assert watch.bad_nodes(["n1", "n2"]) == []
    assert runner.commands() == []
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    ctl.jobs_tick(time.monotonic() + 5)  # the notice, then the nudge to the job's batch step
    assert watch.bad_nodes(["n1", "n2"]) == [] and runner.commands() == []  # not nudged: not read
    watch.on_nudge()
    assert [n.name for n in watch.bad_nodes(["n1", "n2"])] == ["n2"]
    assert unmarked(runner.commands()) == [notice_read(cluster, job_id), node_read(cluster, "n[1-2]")]


def test_a_wrapper_whose_nudge_never_comes_back_keeps_polling_each_poll(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = slurm.sbatch("-N1", "-w", "n1", "-o", "/dev/null", "--wrap", "sleep 300")
    slurm.wait_running(job_id)
    wait_in_accounting(slurm, job_id)
    Controller(settings_for(scripts, tmp_path / "state"), slurm).jobs_tick(time.monotonic())
    monkeypatch.setattr(nodewatch, "NUDGE_PROOF_S", 0.2)
    client, runner = counting(cluster)
    watch = NodeWatch(client, job_id, full_check_s=3600)
    for _ in range(4):
        watch.bad_nodes(["n1"])
        time.sleep(0.1)
    assert not watch.watched()
    assert (
        unmarked(runner.commands())
        == [notice_read(cluster, job_id), nudge_of(job_id)] + [notice_read(cluster, job_id)] * 3
    )
    watch.on_nudge()  # too late: the path was given up, the job stays on polling
    watch.bad_nodes(["n1"])
    assert not watch.watched()
