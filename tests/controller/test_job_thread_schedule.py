"""When the controller's job thread reads what (through the command runner, scripted answers): notices every
pass, the told jobs' release every pass, the whole pending queue only every release_scan_every_s."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hpresilience.controller.loop import Controller
from hpresilience.controller.settings import ControllerSettings
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.testing.fakerunner import FakeRunner
from tests.conftest import FIXTURES, unmarked

SCAN = "squeue -h -t PD -o MARK%A|%r|%k"
SLURM = FIXTURES / "slurm"


def job_json(job_id: int, **fields: object) -> str:
    """`scontrol --json show job J` as 24.11 prints it (recorded), the job's fields changed as given."""
    data = json.loads((SLURM / "scontrol_show_job_24.11.json").read_text())
    data["jobs"] = [dict(data["jobs"][0], job_id=job_id, **fields)]
    return json.dumps(data)


def controller(tmp_path: Path, runner: FakeRunner, **changes: object) -> Controller:
    settings = ControllerSettings.model_validate({"state_dir": str(tmp_path), "metrics_address": "", **changes})
    return Controller(settings, SlurmClient(runner))


def test_the_pending_queue_is_scanned_only_every_release_scan_every_s(tmp_path: Path) -> None:
    runner = FakeRunner().answer("sinfo", "-h", "-N", "-R", stdout="").answer("squeue", "-h", "-t", "PD", stdout="")
    runner.answer("sacct", "-a", "-n", "-P", "-s", "R", stdout="")
    ctl = controller(tmp_path, runner, release_scan_every_s=60)
    now = time.monotonic()
    for i in range(5):  # 5 passes within a minute of the start: notices and the (empty) told-job release only
        ctl.jobs_tick(now + i * 2.0)
    assert runner.commands().count("sinfo -h -N -R -o %N") == 5 and SCAN not in unmarked(runner.commands())
    ctl.jobs_tick(now + 61)
    assert unmarked(runner.commands()).count(SCAN) == 1
    ctl.jobs_tick(now + 63)
    assert unmarked(runner.commands()).count(SCAN) == 1


def test_a_released_job_is_one_the_controller_told(tmp_path: Path) -> None:
    """The release reads the told jobs one by one and starts the one under the hold with the marker."""
    held = job_json(7, job_state=["PENDING"], state_reason="BeginTime", comment="run a=1 hpr:requeued")
    runner = FakeRunner().answer("scontrol", "--json", "show", "job", "7", stdout=held)
    runner.answer("scontrol", "update", stdout="")
    ctl = controller(tmp_path, runner, release_scan_every_s=0)
    ctl.notifier.recent[7] = time.monotonic()
    assert ctl.release_requeued() == 1
    assert runner.commands()[-2:] == [
        "scontrol update jobid=7 StartTime=now",
        "scontrol update jobid=7 Comment=run a=1",
    ]


def test_a_notice_refused_by_a_busy_slurmctld_is_written_on_the_next_pass(tmp_path: Path) -> None:
    runner = FakeRunner(retries=0)
    runner.answer("squeue", "-h", "-t", "R,CG,S", "-w", "n2", stdout="7|n[1-2]\n")
    runner.answer("scontrol", "--json", "show", "job", "7", stdout=job_json(7, admin_comment="site note"))
    runner.answer("scontrol", "update", exit_code=1, stderr="slurm_update error: Socket timed out on send/recv")
    runner.answer("scontrol", "update", stdout="")
    runner.answer("scancel", stdout="")
    notifier = controller(tmp_path, runner).notifier
    bad = [
        Node(
            name="n2",
            address="a",
            hostname="h",
            states=frozenset({"ALLOCATED", "FAIL"}),
            reason="Action:Replace",
            reason_changed_at=1764090077,
        )
    ]
    assert notifier.notify(bad) == 0
    assert notifier.notify(bad) == 1  # the same snapshot: tried again, not taken as done
    assert runner.commands()[-2:] == [
        "scontrol update jobid=7 AdminComment=site note hpr:bad=n2@1764090077",
        "scancel --signal=28 --full --batch 7",
    ]  # written, then nudged
    assert notifier.notify(bad) == 0 and runner.commands().count("squeue -h -t R,CG,S -w n2 -o %i|%N") == 2


def test_running_batch_jobs_are_listed_from_slurmdbd_only_every_watch_jobs_every_s(tmp_path: Path) -> None:
    runner = FakeRunner().answer("sinfo", "-h", "-N", "-R", stdout="").answer("squeue", stdout="")
    runner.answer("sacct", "-a", "-n", "-P", "-s", "R", stdout="")
    ctl = controller(tmp_path, runner, watch_jobs_every_s=30, release_scan_every_s=0)
    now = time.monotonic()
    for i in range(15):  # 15 passes, one every 2 s over 28 s: one listing
        ctl.jobs_tick(now + i * 2.0)
    listing = "sacct -a -n -P -s R -o JobIDRaw,State"
    assert runner.commands().count(listing) == 1
    ctl.jobs_tick(now + 31)
    assert runner.commands().count(listing) == 2
    assert not any(c.startswith("squeue -h -t") or c.startswith("scontrol update") for c in runner.commands())


def test_an_unreachable_slurmdbd_writes_no_lease_and_the_notices_go_on(tmp_path: Path) -> None:
    runner = FakeRunner(retries=0).answer("sinfo", "-h", "-N", "-R", stdout="").answer("squeue", stdout="")
    runner.answer("sacct", exit_code=1, stderr="sacct: error: Problem talking to the database: Connection refused")
    ctl = controller(tmp_path, runner, watch_jobs_every_s=30, release_scan_every_s=0)
    now = time.monotonic()
    ctl.jobs_tick(now)
    ctl.jobs_tick(now + 2)
    assert runner.commands().count("sinfo -h -N -R -o %N") == 2  # the notices' listing, every pass
    assert ctl.notifier.leases == {} and not any(c.startswith("scontrol update") for c in runner.commands())
