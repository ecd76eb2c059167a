"""The controller's nudge on real daemons: a wrapper in a batch job, its lease and its notice, end to end.

The controller (job thread only, as root) leases the running batch job and, once a node under it is marked
bad, writes the notice and nudges the batch step (SIGWINCH through `scancel --full --batch`). The wrapper must
see the mark within 2 s, through the nudge (its full node check is 120 s away and, watched, it reads its job
only every 60 s otherwise), while the tasks, which catch SIGWINCH here, must never receive it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpresilience.controller.loop import Controller
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_wrapper_integration import Run
from tests.controller.conftest import settings_for, write_scripts

pytestmark = pytest.mark.integration

TASK = """import signal, sys, time
signal.signal(signal.SIGWINCH, lambda s, f: print("task got SIGWINCH", flush=True))
while True:
    print("tick", flush=True)
    time.sleep(0.2)
"""


def wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)
    return found


def test_a_controllers_mark_reaches_the_running_wrapper_within_2_s_by_its_nudge_and_no_task_gets_it(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    scripts = write_scripts(tmp_path / "scripts", cluster)
    task = tmp_path / "task.py"
    task.write_text(TASK)
    ctl = Controller(settings_for(scripts, tmp_path / "ctl", watch_jobs_every_s=0.5), slurm)
    thread = ctl.start_jobs_thread()
    run = Run(cluster, slurm, tmp_path, "", f"{sys.executable} {task}", nodes=2)
    bad = ""
    try:
        run.wait_output("tick")
        # The lease (once slurmdbd lists the batch step), then the wrapper's own nudge proves the path.
        wait_for("the wrapper trusting its lease", lambda: "job_nudges_received" in run.err, 30)
        bad = slurm.job(run.job_id).nodes[-1]
        t0 = time.time()
        slurm.set_node_state([bad], "fail", "Action:Replace")
        seen = wait_for("node_fault_seen", lambda: run.named("node_fault_seen"), 10)
        assert seen[0]["node"] == bad
        assert seen[0]["time"] - t0 <= 2.0, seen[0]
        time.sleep(0.5)  # a nudge on its way to a task would have arrived by now
        assert "task got SIGWINCH" not in run.out + run.err
        assert "job_nudge_not_received" not in run.err
    finally:
        slurm.cancel(run.job_id)
        if bad:
            slurm.set_node_state([bad], "resume")
        ctl.stop()
        thread.join(timeout=10)
