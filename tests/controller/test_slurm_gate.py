"""Integration: the `slurm` health gate (the default) runs the node's check as a job in a maintenance reservation,
keeps the job's output, and never lets another job onto the node; the whole repair loop with it."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from hpresilience.controller.gates import GateContext, GateResult, GateSettings, create_gate
from hpresilience.controller.loop import Controller
from hpresilience.controller.settings import ControllerSettings
from hpresilience.controller.state import RepairRecord, Step
from hpresilience.reasons import Action
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.testing.devcluster import DevCluster
from tests.controller.conftest import history, settings_for, wait_until, write_scripts

pytestmark = pytest.mark.integration
REASON = "Action:Replace [hpr-controller] repairing: replace (attempt 1) via script"


def job_script(tmp_path: Path, body: str) -> list[str]:
    """The gate's job: a Python program run on the node by Slurm (this machine's interpreter is on every node)."""
    p = tmp_path / "gate_job.py"
    p.write_text(body)
    return [sys.executable, str(p)]


def reservations(slurm: SlurmClient) -> str:
    return slurm.runner.run("scontrol", "show", "reservation", "-o", check=False).stdout


def queue(slurm: SlurmClient, name: str) -> list[str]:
    out = slurm.runner.run("squeue", "-h", f"--name={name}", "-o", "%T|%N").stdout
    return out.split()


def test_gate_job_runs_on_the_node_in_a_reservation_while_other_jobs_wait(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """The gate's job runs on n3 although the repair drained it; a job asking for n3 meanwhile does not start
    (the reservation); afterwards n3 is drained again with the repair's reason, the reservation is gone, and
    the job's output is kept as evidence."""
    go = tmp_path / "go"
    argv = job_script(
        tmp_path,
        (
            "import os, pathlib, time\n"
            "print('gate job', os.environ.get('SLURM_JOB_NAME'), 'on', os.environ.get('SLURMD_NODENAME'), flush=True)\n"
            f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.1)\n"
            "print('all checks passed')\n"
        ),
    )
    slurm.set_node_state(["n3"], "drain", REASON)
    gate = create_gate(
        GateSettings(kind="slurm", job_command=argv, timeout_s=60), GateContext(slurm, tmp_path / "evidence")
    )
    result: list[GateResult] = []
    t = threading.Thread(target=lambda: result.append(gate.check(slurm.node("n3"))))
    t.start()
    try:
        wait_until(lambda: queue(slurm, "hpr-gate-n3") == ["RUNNING|n3"], "the gate job to run on n3", 30)
        assert "ReservationName=hpr-gate-n3" in reservations(slurm) and "Flags=MAINT" in reservations(slurm)
        other = slurm.sbatch("--nodelist=n3", "--job-name=hpr-test-other", "--wrap=true")
        wait_until(lambda: slurm.job(other).state_reason, "the other job to be considered", 10)
        assert slurm.job(other).is_pending
    finally:
        go.touch()
        t.join(timeout=60)
    [res] = result
    assert res.passed and "gate job exit 0" in res.detail and "all checks passed" in res.detail
    n3 = slurm.node("n3")
    assert n3.has("DRAIN") and n3.reason == REASON
    assert "hpr-gate-n3" not in reservations(slurm)
    assert slurm.job(other).is_pending  # drained again before the reservation went: still nothing lands on n3
    [evidence] = (tmp_path / "evidence").glob("n3-*.json")
    kept = json.loads(evidence.read_text())
    assert kept["exit_code"] == 0 and "gate job hpr-gate-n3 on n3" in kept["output"]


def test_gate_job_failure_fails_the_gate_with_its_output(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    argv = job_script(
        tmp_path, "import sys\nprint('gpu.count fail reboot: 7 usable GPU(s), profile expects 8')\nsys.exit(1)\n"
    )
    slurm.set_node_state(["n2"], "drain", REASON)
    res = create_gate(
        GateSettings(kind="slurm", job_command=argv, timeout_s=60), GateContext(slurm, tmp_path / "evidence")
    ).check(slurm.node("n2"))
    assert not res.passed and "gate job exit 1" in res.detail and "7 usable GPU(s)" in res.detail
    assert slurm.node("n2").has("DRAIN") and slurm.node("n2").reason == REASON
    assert "hpr-gate-n2" not in reservations(slurm)


def test_repair_with_the_slurm_gate_resumes_the_node_once_the_gate_job_passed(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """The whole loop with the default gate kind: provider, slurmd back, gate job in the reservation, resume.
    The gate lets the node out of its DRAIN while its job runs: the loop must not read that as the node
    having been resumed by someone else."""
    scripts = write_scripts(tmp_path / "scripts", cluster)
    argv = job_script(tmp_path, "import time\ntime.sleep(1.5)\nprint('healthy')\n")
    settings = settings_for(scripts, tmp_path / "state", gate={"kind": "slurm", "job_command": argv, "timeout_s": 60})
    ctl = Controller(settings, slurm)
    slurm.set_node_state(["n4"], "fail", "Action:Replace")

    def repaired() -> bool:
        ctl.cycle()
        return not ctl.records

    wait_until(repaired, "the repair of n4 to finish", timeout=90)
    ctl.pool.shutdown()
    [done] = history(tmp_path / "state")
    assert done["outcome"] == "repaired" and "gate job exit 0: healthy" in done["last_health"]["detail"]
    n4 = wait_until(lambda: n if (n := slurm.node("n4")).is_idle else None, "n4 idle", 15)
    assert not n4.reason
    assert "hpr-gate-n4" not in reservations(slurm)
    assert list((tmp_path / "state" / "gates").glob("n4-*.json"))


def test_a_node_snapshot_read_before_the_gate_returned_is_not_used_for_that_node(tmp_path: Path) -> None:
    """While the slurm gate's job runs, the node is out of its DRAIN with no reason. A cycle whose snapshot was
    read then, but which runs after the gate returned, would take the node for resumed by someone else (and end
    the repair without resuming it): that node waits for the next snapshot."""
    settings = ControllerSettings.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "metrics_address": "",
            "gate": {"kind": "none"},
            "default_provider": "script",
            "default_options": {"command": ["/bin/true"]},
        }
    )
    ctl = Controller(settings, SlurmClient())
    rec = RepairRecord(node="n3", requested=Action.REPLACE, reason="Action:Replace", provider="script", detected_at=1.0)
    rec.move(Step.GATING, "slurmd registered again")
    ctl.records["n3"] = rec
    read_at = time.monotonic()
    in_reservation = Node(
        name="n3", address="127.0.0.13", hostname="localhost", states=frozenset({"IDLE", "MAINTENANCE", "RESERVED"})
    )
    ctl._submit(rec, ctl.gate.check, in_reservation)
    ctl.inflight["n3"].result(timeout=10)
    ctl.process([in_reservation], time.time(), read_at)
    assert ctl.records["n3"].step == "gating" and "n3" in ctl.inflight
    ctl.pool.shutdown()
