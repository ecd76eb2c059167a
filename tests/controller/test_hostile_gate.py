"""A hostile user against the `slurm` health gate (issue 31, point 9): the gate's job runs as root, and a gate
that times out cancels it by name. A job name is anyone's to choose, and /tmp is everyone's to write."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from hpresilience.controller.gates import GateContext, GateSettings, create_gate
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.controller.conftest import Nobody, wait_until

REASON = "Action:Replace [hpr-controller] repairing: replace (attempt 1) via script"


def state(slurm: SlurmClient, job_id: int) -> str:
    return slurm.runner.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T").stdout.strip()


@pytest.mark.integration
def test_a_timed_out_gate_cancels_its_own_job_and_no_users_job_of_the_same_name(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, nobody: Nobody
) -> None:
    theirs = nobody.sbatch("--job-name=hpr-gate-n3", "--begin=now+1hour", "--wrap", "true")
    slurm.set_node_state(["n3"], "drain", REASON)
    gate = create_gate(
        GateSettings(kind="slurm", job_command=[sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=3),
        GateContext(slurm, tmp_path / "evidence"),
    )
    res = gate.check(slurm.node("n3"))
    assert not res.passed and "did not run to its end" in res.detail
    assert state(slurm, theirs) == "PENDING"  # root's `scancel --name` names its own user and reservation
    ours = ["squeue", "-h", "--name=hpr-gate-n3", "-u", "root", "-t", "PD,R", "-o", "%T"]
    wait_until(lambda: not slurm.runner.run(*ours).stdout.strip(), "the gate's own job to be gone", 15)


@pytest.mark.integration
def test_the_gate_job_runs_in_a_directory_no_user_writes(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    slurm.set_node_state(["n2"], "drain", REASON)
    gate = create_gate(
        GateSettings(kind="slurm", job_command=[sys.executable, "-c", "import os; print('cwd', os.getcwd())"]),
        GateContext(slurm, tmp_path / "evidence"),
    )
    res = gate.check(slurm.node("n2"))
    assert res.passed and "cwd /" in res.detail and "cwd /tmp" not in res.detail


@pytest.mark.parametrize("path", ["/tmp", "/tmp/gate", "/var/tmp", "/dev/shm/x", "scratch"])
def test_a_gate_directory_users_write_or_a_relative_one_is_refused(path: str) -> None:
    with pytest.raises(ValidationError, match="job_chdir"):
        GateSettings(kind="slurm", job_chdir=path)
    assert GateSettings(kind="slurm").job_chdir == "/"
