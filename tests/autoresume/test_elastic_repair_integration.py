"""Elastic runs and the controller's repair together (issue 32): HyperPod's recipe on 3 nodes with
`--auto-resume-min-nodes=2`, no idle node, a controller whose repair takes a while. The failed node leaves the
job when the step goes short, so the controller repairs it at once (it waits for a node's jobs, up to 600 s)
and the recipe's NODE_LIST (`scontrol show jobid`) never names it; once it is back, grow back merges it and the
step runs on 3 nodes again within 60 s. Both the `script` provider (a site script) and the `reboot` provider
(Slurm's `scontrol reboot`, on a cluster whose RebootProgram restarts the node's slurmd) are driven.

HPR_TEST_REPAIR_S sets the repair's length (10 s by default, for the suite's time; the issue's case is 45)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hpresilience.controller.loop import Controller
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_recipe_integration import Recipe, fill_the_rest
from tests.conftest import TEST_BASE_PORT, TEST_SLURMD_TIMEOUT, require_slurm, reset_cluster
from tests.controller.conftest import history, settings_for, start_controller, write_scripts  # noqa: F401

pytestmark = pytest.mark.integration

REPAIR_S = float(os.environ.get("HPR_TEST_REPAIR_S", "10"))
STEP_S = 0.3
# Long enough to be repaired and grow back while it trains; the test ends the job once it runs on 3 again.
STEPS = int((REPAIR_S + 150) / STEP_S)

# slurmd runs RebootProgram on its node: the devcluster's nodes share one host, so the program finds its node's
# name on the slurmd above it, and "reboots" it as restart-node does (every process of the node ends, a fresh
# slurmd registers, with -b: rebooted), after the repair's delay. Detached: restart-node ends slurmd's children.
REBOOT_PROGRAM = """#!/bin/sh
pid=$$
name=""
while [ "$pid" -gt 1 ]; do
    cmd=$(tr '\\0' ' ' < /proc/$pid/cmdline)
    case "$cmd" in *slurmd*" -N "*) name=${{cmd##*-N }}; name=${{name%% *}}; break;; esac
    pid=$(awk '/^PPid:/{{print $2}}' /proc/$pid/status)
done
echo "$name $(date +%s.%N)" >> "{log}"
export PYTHONPATH="{pythonpath}"
setsid -f sh -c 'sleep {delay}; exec "$1" -m hpresilience devcluster restart-node --reboot "$0" --state-dir "$2"' \\
    "$name" "{python}" "{state}" </dev/null >/dev/null 2>&1
"""


@pytest.fixture(scope="module")
def rebooting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """4 nodes with slurmdbd (a job resized more than once) and a RebootProgram (the session cluster has none)."""
    require_slurm()
    root = tmp_path_factory.mktemp("rebooting")
    program = root / "reboot.sh"
    state = root / "cluster"
    program.write_text(
        REBOOT_PROGRAM.format(
            log=root / "reboots.log",
            delay=REPAIR_S,
            python=sys.executable,
            state=state,
            pythonpath=os.environ.get("PYTHONPATH", ""),  # slurmd runs it with an environment of its own
        )
    )
    program.chmod(0o755)
    cl = DevCluster(
        state_dir=state,
        nodes=4,
        base_port=TEST_BASE_PORT + 800,
        overrides={"SlurmdTimeout": TEST_SLURMD_TIMEOUT, "RebootProgram": str(program), "ResumeTimeout": "300"},
    )
    cl.up(timeout=90)
    yield cl
    cl.down()


class NodeWatch:
    """The victim's state every 0.2 s, from the test's side: when it came back in service (idle, no flag)."""

    def __init__(self, slurm: SlurmClient, node: str) -> None:
        self.slurm, self.node = slurm, node
        self.back_at: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(0.2) and self.back_at is None:
            n = self.slurm.node(self.node)
            # Out of service all along since the fault (FAIL, then the controller's DRAIN): the first look
            # without a flag is its return, idle or already merged by the grow back.
            flags = ("DRAIN", "FAIL", "DOWN", "NOT_RESPONDING", "REBOOT_ISSUED", "REBOOT_REQUESTED")
            if not n.has(*flags):
                self.back_at = time.time()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def views(out: str) -> list[dict[str, str]]:
    """The recipe's own line per node per attempt: node=, nnodes=, NODE_LIST=, MASTER_ADDR=."""
    return [dict(kv.split("=", 1) for kv in line.split()) for line in out.splitlines() if line.startswith("node=")]


def hostnames(run: Recipe, nodelist: str) -> list[str]:
    res = subprocess.run(["scontrol", "show", "hostnames", nodelist], env=run.env, capture_output=True, text=True)
    return res.stdout.split()


def short_then_repaired_then_grown(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, start: Callable[[Controller], Controller], **ctl: Any
) -> tuple[str, dict[str, float]]:
    """The issue's run: fault on a non-batch node, short at once, repaired by the controller, grown back; the
    failed node and the figures (s) are returned, the figures printed."""
    run = Recipe(
        cluster,
        tmp_path / "job",
        steps=STEPS,
        sbatch_args=("-N", "3"),
        srun_args="--auto-resume-min-nodes=2",
        extra_env={"TRAIN_STEP_SLEEP": str(STEP_S)},
    )
    try:
        return fault_repair_grow_back(cluster, slurm, tmp_path, start, run, **ctl)
    finally:  # also when it failed: its torchrun port is the next test's
        with contextlib.suppress(HPResilienceError):
            slurm.cancel(run.job_id)


def fault_repair_grow_back(
    cluster: DevCluster,
    slurm: SlurmClient,
    tmp_path: Path,
    start: Callable[[Controller], Controller],
    run: Recipe,
    **ctl: Any,
) -> tuple[str, dict[str, float]]:
    run.wait(lambda: "step=4\n" in run.out, "step 4", timeout=120)
    fill_the_rest(cluster, slurm, run, 3)  # the 4th node is busy: no replacement at hand
    scripts = write_scripts(tmp_path / "scripts", cluster, provider_delay_s=REPAIR_S)
    ctl = {"default_options": {"command": [str(scripts.provider)], "timeout_s": REPAIR_S + 60}, **ctl}
    settings = settings_for(
        scripts,
        tmp_path / "ctl",
        forced_down_after_s=600,  # the default: a node still in the job would wait this long
        come_back_timeout_s=REPAIR_S + 60,
        **ctl,
    )
    start(Controller(settings, slurm))
    job = slurm.job(run.job_id)
    victim = [n for n in job.nodes if n != job.batch_host][-1]
    slurm.set_node_state([victim], "fail", "Action:Replace")
    fault_at = time.time()
    short = run.wait(lambda: run.named("step_running"), "the step on the healthy nodes")[0]
    assert run.named("running_short")[0]["nodes_now"] == 2
    # The failed node left the job: the job's NodeList is the short step's nodes.
    released = run.named("allocation_shrunk")
    assert released and released[0]["released"] == victim, run.events()
    assert victim not in slurm.job(run.job_id).nodes
    watch = NodeWatch(slurm, victim)
    try:
        # The controller acts at once (no job holds the node), not after forced_down_after_s.
        acting = run.wait(
            lambda: "repair" in slurm.node(victim).reason,  # the controller's reason (`repairing: ...`)
            "the controller's repair",
            timeout=30,
        )
        assert acting
        repair_at = time.time()
        run.wait(lambda: watch.back_at, "the node back in service", timeout=REPAIR_S + 90)
        back_at = watch.back_at
        assert back_at is not None
        grown = run.wait(
            lambda: [e for e in run.named("step_running") if e["time"] > back_at and len(run.named("step_moved")) > 0],
            "the step on 3 nodes again",
            timeout=90,
        )[0]
    finally:
        watch.close()
    moved = run.named("step_moved")[0]
    assert moved["nodes_now"] == 3 and victim in moved["nodes"].split(","), moved
    assert run.named("attempt_started")[-1]["nodes"].count(",") == 2
    assert run.named("allocation_grown")[-1]["added"] == victim
    # The recipe's view: while short, NODE_LIST and MASTER_ADDR never name the failed node; back at 3, all three.
    seen = views(run.out)
    short_views = [v for v in seen if v["nnodes"] == "2"]
    assert len(short_views) == 2, seen
    victim_addr = slurm.node(victim).address
    for v in short_views:
        assert victim not in hostnames(run, v["NODE_LIST"]) and v["MASTER_ADDR"] != victim_addr, v
    run.wait(lambda: len([v for v in views(run.out) if v["nnodes"] == "3"]) >= 6, "the recipe on 3 nodes again")
    last = [v for v in views(run.out) if v["nnodes"] == "3"][-1]
    assert sorted(hostnames(run, last["NODE_LIST"])) == sorted(run.named("attempt_started")[-1]["nodes"].split(","))
    run.wait(lambda: len(re.findall(r"resumed from step", run.out)) >= 2, "the resume on 3 nodes")
    assert not run.named("job_requeue_requested") and len(run.named("policy_decided")) == 1
    figures = {
        "fault_to_short_step_s": short["time"] - fault_at,
        "fault_to_repair_started_s": repair_at - fault_at,
        "node_back_to_3_node_step_s": grown["time"] - back_at,
        "repair_s": REPAIR_S,
    }
    print(" ".join(f"{k}={v:.2f}" for k, v in figures.items()))
    return victim, figures


def test_running_short_releases_the_failed_node_the_script_provider_repairs_it_and_the_job_grows_back(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, start_controller: Callable[[Controller], Controller]
) -> None:
    """Script provider taking HPR_TEST_REPAIR_S: the repair starts within seconds of the fault (not after the
    600 s forced-down wait), and the step is back on 3 nodes within 60 s of the node's return."""
    victim, figures = short_then_repaired_then_grown(cluster, slurm, tmp_path, start_controller)
    assert write_scripts(tmp_path / "scripts", cluster).calls == [f"{victim} replace"]
    assert figures["fault_to_short_step_s"] <= 5.0
    assert figures["fault_to_repair_started_s"] <= 10.0
    assert figures["node_back_to_3_node_step_s"] <= 60.0


def test_running_short_releases_the_failed_node_the_reboot_provider_reboots_it_and_the_job_grows_back(
    rebooting: DevCluster, tmp_path: Path, start_controller: Callable[[Controller], Controller]
) -> None:
    """The `reboot` provider (`scontrol reboot ASAP`): slurmctld reboots a node only once no job holds it, so
    it could not even start while the node stayed in the job; released, the reboot starts at once and the step
    is back on 3 nodes within 60 s of the node's return."""
    reset_cluster(rebooting)
    slurm = rebooting.client()
    victim, figures = short_then_repaired_then_grown(
        rebooting, slurm, tmp_path, start_controller, default_provider="reboot", default_options={}
    )
    # slurmctld ran the RebootProgram on that node once: the repair was Slurm's reboot.
    reboots = (rebooting.state_dir.parent / "reboots.log").read_text().splitlines()
    assert [line.split()[0] for line in reboots] == [victim]
    assert figures["fault_to_short_step_s"] <= 5.0
    assert figures["fault_to_repair_started_s"] <= 10.0
    assert figures["node_back_to_3_node_step_s"] <= 60.0
