"""A hostile user against the controller's notices, on the real devcluster (issue 31, point 8).

The controller reads a job's AdminComment and writes it back as root with its own word in it (the bad-node
notice, the watch lease). AdminComment is the site's: only an operator writes it. `nobody` runs a job whose
JobName, WorkDir or Comment holds a newline and an `AdminComment=...` line, which scontrol's multi-line form
prints before (or instead of) the real field. None of that text may end up in the job's AdminComment."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.controller.loop import Controller
from hpresilience.slurm.adminword import write_watch
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.controller.conftest import Nobody, Scripts, settings_for, wait_until

pytestmark = pytest.mark.integration
LOOKALIKE = "\n   AdminComment=hpr:watch=1 hpr:bad=n4@1 from-the-user"


def state(slurm: SlurmClient, job_id: int) -> str:
    return slurm.runner.run("squeue", "-h", "-j", str(job_id), "-o", "%T").stdout.strip()


def admin_comment(slurm: SlurmClient, job_id: int) -> str:
    """The field alone: squeue's admin_comment for one plain job (only an operator writes it)."""
    out = slurm.runner.run("squeue", "-h", "-j", str(job_id), "-O", "admin_comment:0").stdout.removesuffix("\n")
    return "" if out == "(null)" else out


@pytest.mark.parametrize("field", ["JobName", "WorkDir", "Comment"])
def test_admin_comment_lookalikes_in_a_users_fields_never_reach_the_admin_comment(
    cluster: DevCluster, slurm: SlurmClient, scripts: Scripts, tmp_path: Path, nobody: Nobody, field: str
) -> None:
    workdir = nobody.folder("w" + LOOKALIKE) if field == "WorkDir" else nobody.public
    args = {"JobName": [f"--job-name=train{LOOKALIKE}"], "WorkDir": [], "Comment": [f"--comment=exp7{LOOKALIKE}"]}
    job_id = nobody.salloc("-N1", "-w", "n2", *args[field], cwd=workdir)
    # Not slurm.wait_running: on 22.05 the client reads a job from `scontrol show job -o`, which such a JobName
    # cuts in two (the wrapper's own job, never a root action).
    wait_until(lambda: state(slurm, job_id) == "RUNNING", f"job {job_id} to run")
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    Controller(settings_for(scripts, tmp_path / "state", watch_jobs_every_s=0), slurm).notify_jobs()
    notice = admin_comment(slurm, job_id)
    assert notice.startswith("hpr:bad=n2@") and " " not in notice  # our word alone: nothing of the user's
    assert write_watch(slurm, job_id, 1234)  # the lease, written the same way
    assert admin_comment(slurm, job_id) == f"{notice} hpr:watch=1234"
