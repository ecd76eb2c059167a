"""The wrapper's step operations survive odd answers: a bad line costs that line, a refusal is a warning."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.runner import CommandRunner
from hpresilience.slurm.steps import NOTICE_SCRIPT, job_steps, signal_step


def fake_bin(tmp_path: Path, tool: str, stdout: str, stderr: str = "", rc: int = 0) -> SlurmClient:
    """A client whose `tool` is a script printing a recorded answer (squeue cannot be made to print a broken
    hostlist, scancel's refusal needs another user's job)."""
    (tmp_path / "out.txt").write_text(stdout)
    (tmp_path / "err.txt").write_text(stderr)
    script = tmp_path / tool
    script.write_text(f"#!/bin/sh\ncat {tmp_path}/out.txt\ncat {tmp_path}/err.txt >&2\nexit {rc}\n")
    script.chmod(0o755)
    return SlurmClient(CommandRunner(str(tmp_path), timeout=5, retries=0))


def test_one_malformed_step_line_costs_only_its_nodes(tmp_path: Path) -> None:
    client = fake_bin(tmp_path, "squeue", "12.0|train|n[1-2]\n12.1|probe|n[3-\nbroken line\n12.2|x|n4\n")
    steps = job_steps(client, 12)
    assert [(s.step_id, s.nodes) for s in steps] == [("12.0", ("n1", "n2")), ("12.1", ()), ("12.2", ("n4",))]


def test_a_refused_scancel_is_a_warning_not_a_signalled_step(tmp_path: Path) -> None:
    client = fake_bin(
        tmp_path, "scancel", "", "scancel: error: Kill job error on job id 12.0: Access/permission denied", rc=1
    )
    with capture_logs() as logs:
        signal_step(client, "12.0", "USR1")
    events = [e["event"] for e in logs]
    assert "step_signal_refused" in events and "step_signalled" not in events
    assert next(e for e in logs if e["event"] == "step_signal_refused")["log_level"] == "warning"


def _notice(path: Path, mode: str = "write") -> subprocess.CompletedProcess[str]:
    """The notice script as srun runs it on a node (`sh -c SCRIPT hpr-notice write`), here on this host."""
    env = {"PATH": "/usr/bin:/bin", "HPR_NOTICE_FILE": str(path), "HPR_NOTICE_REASON": "grow back"}
    return subprocess.run(
        ["sh", "-c", NOTICE_SCRIPT, "hpr-notice", mode], env=env, capture_output=True, text=True, timeout=10
    )


def test_the_notice_is_written_in_a_new_0700_directory_and_cleared_with_it(tmp_path: Path) -> None:
    notice = tmp_path / "hpr-0-abc" / "notice"
    assert _notice(notice).returncode == 0
    assert stat.S_IMODE(notice.parent.stat().st_mode) == 0o700 and notice.read_text() == "grow back\n"
    assert stat.S_IMODE(notice.stat().st_mode) & 0o077 == 0
    assert _notice(notice, "clear").returncode == 0 and not notice.parent.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_the_notice_is_not_written_into_a_directory_another_user_prepared(tmp_path: Path) -> None:
    d = tmp_path / "hpr-0-abc"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    assert _notice(d / "notice").returncode == 3 and not (d / "notice").exists()
    assert _notice(d / "notice", "clear").returncode == 0 and d.is_dir()  # not ours: not removed


def test_the_notice_follows_no_link(tmp_path: Path) -> None:
    """A link at the directory's or the file's name (planted before the wrapper writes) is not written through."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "hpr-0-abc").symlink_to(real)
    assert _notice(tmp_path / "hpr-0-abc" / "notice").returncode == 3 and not (real / "notice").exists()
    d = tmp_path / "hpr-0-def"
    d.mkdir(mode=0o700)
    target = tmp_path / "target"
    target.write_text("kept")
    (d / "notice").symlink_to(target)
    assert _notice(d / "notice").returncode == 4 and target.read_text() == "kept"
