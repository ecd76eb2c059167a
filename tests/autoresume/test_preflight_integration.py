"""Preflight on a new node set (decide/preflight.py), on `devcluster up --isolation netns`: a job of 3 nodes (2 in
the step, 1 hot spare) whose spare's link is capped (tbf, 4 Mbit/s each way: it passes every health check, and
Slurm's own messages get through); a training node marked `Action:Replace`. The relaunch would go onto the spare:
the preflight times its transfer, keeps it out with the evidence, and the step takes the cluster's idle 4th node
instead (the job grows), which passes. The healthy relaunch costs the check's time once, and a step relaunched on
the same nodes none. A spare whose link is cut instead (partitioned) is kept out the same way: srun cannot start
its task there."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpresilience.autoresume.decide.preflight import judge
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.preflight import run_preflight
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.netns import Isolation
from tests.autoresume.test_partition_integration import Job, ended, sync_job, wait_idle
from tests.autoresume.test_recipe_integration import job_notices
from tests.conftest import TEST_BASE_PORT, require_slurm
from tests.testing.test_netns_integration import need_netns

pytestmark = pytest.mark.integration
PORT = TEST_BASE_PORT + 550  # between the +500 and +600 modules' clusters
CAP_BPS = 4_000_000  # 0.5 MB/s: a 4 MB transfer takes 8 s, under the 2 MB/s floor


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    need_netns()
    cl = DevCluster(
        state_dir=tmp_path_factory.mktemp("preflight") / "cluster", nodes=4, base_port=PORT, isolation=Isolation.NETNS
    )
    cl.up(timeout=60)
    yield cl
    cl.down()


@pytest.mark.parametrize("fault", ["capped", "partitioned"])
def test_a_spare_with_a_capped_or_cut_link_is_kept_out_by_the_preflight_and_the_step_takes_another_node(
    hosts: DevCluster, tmp_path: Path, fault: str
) -> None:
    slurm = hosts.client()
    wait_idle(hosts, slurm)
    config = tmp_path / "preflight.yaml"
    config.write_text("autoresume:\n  preflight: on\n")  # off by default: it costs every relaunch onto a spare ~2 s
    job = sync_job(hosts, tmp_path, STEP_SLEEP="0.3", HPRESILIENCE_CONFIG=str(config))
    with ended(slurm, job):
        job.wait(lambda: 3 in job.steps(), "step 3", 120)
        alloc = slurm.job(job.job_id)
        first = job.named("attempt_started")[0]["nodes"].split(",")
        spare = next(n for n in alloc.nodes if n not in first)
        victim = next(n for n in first if n != alloc.batch_host)
        idle = next(n for n in hosts.names() if n not in alloc.nodes)
        if fault == "capped":
            hosts.slow(spare, bps=CAP_BPS)
        else:
            hosts.partition(spare)
        try:
            marked_at = job.named("attempt_started")[0]["time"]
            with job_notices(slurm):  # the controller's part: tell the job of its failed node
                slurm.set_node_state([victim], "fail", "Action:Replace")
                kept = job.wait(lambda: job.named("preflight_node_kept_out"), "the spare kept out", 90)[0]
                passed = job.wait(lambda: job.named("preflight_passed"), "the preflight on the grown node", 120)[0]
                job.wait(lambda: re.search(r"^resumed from step \d+$", job.out, re.MULTILINE), "the resume", 120)
        finally:
            if fault == "capped":
                hosts.slow(spare, bps=0)
            else:
                hosts.heal(spare)
            for node in (victim, spare):  # the next test wants every node idle (a cut node may be DOWN by now)
                with contextlib.suppress(HPResilienceError):
                    slurm.set_node_state([node], "resume")
        assert kept["node"] == spare and kept["hub"] != spare, kept
        words = ("MB/s", "did not finish") if fault == "capped" else ("could not start", "did not join")
        assert any(w in kept["why"] for w in words), kept
        assert kept["took_s"] < 20.0, kept  # the hub gives up once the transfer is already too slow, not at the bound
        assert passed["new"] == idle and idle in passed["transfer_s"], passed
        second = job.named("attempt_started")[1]["nodes"].split(",")
        assert spare not in second and victim not in second and idle in second
        assert not job.named("preflight_inconclusive")
        checks = job.named("preflight_node_kept_out") + job.named("preflight_passed")
        assert len(checks) == 2  # the first attempt (no node known good) ran none
        marked = [e for e in job.named("node_fault_seen")] or [{"time": marked_at}]
        print(
            f"{fault} spare kept out {kept['time'] - marked[0]['time']:.1f} s after the fault was seen "
            f"(check {kept['took_s']:.1f} s); healthy 2-node check {passed['took_s']:.1f} s "
            f"(transfer {passed['transfer_s']}, joins {passed['joined_s']})"
        )


def test_a_healthy_three_node_set_passes_the_check_in_seconds(hosts: DevCluster, tmp_path: Path) -> None:
    slurm = hosts.client()
    wait_idle(hosts, slurm)
    job = Job(hosts, tmp_path, "#!/bin/bash\nsleep 300\n", {}, "-N3")
    with ended(slurm, job):
        nodes = list(job.wait(lambda: (j := slurm.job(job.job_id)).state == "RUNNING" and j.nodes, "the job", 60))
        hub = slurm.node(nodes[0])
        started = time.monotonic()
        rep = run_preflight(slurm, job.job_id, nodes, hub.address, PORT + 90, 20.0, 4.0, {**os.environ, **job.env})
        took = time.monotonic() - started
    verdict = judge(rep, nodes, nodes[1:], AutoResumeSettings())
    assert verdict.conclusive and verdict.kept_out == {}, rep
    assert set(rep.joined) == set(nodes) and set(rep.transfer_s) == set(nodes[1:]) and rep.done
    print(f"healthy 3-node check {took:.1f} s (transfer {rep.transfer_s}, joins {rep.joined})")
