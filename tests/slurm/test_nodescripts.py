"""The scripts the wrapper runs on a job's nodes, run here as srun runs them, and the pure readers of their output:
a line that is not the script's costs that line, a node that printed no closing line did not report."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from hpresilience.slurm.nodescripts import (
    NOTICE_SCRIPT,
    StaleTask,
    parse_live_lines,
    parse_notice_lines,
    parse_stale_lines,
    parse_stepd_lines,
)


def test_a_reap_report_names_what_was_killed_and_the_nodes_that_never_reported() -> None:
    text = (
        "hpr-stale n1 4242 python train.py --lr 1e-4\n"
        "hpr-stale n1 notapid python\n"  # a pid that is not a number: not ours
        "user output hpr-reaped n9\n"
        "hpr-reaped n1\n"
    )
    killed, missing = parse_stale_lines(text, ["n1", "n2"])
    assert killed == [StaleTask("n1", 4242, "python train.py --lr 1e-4")]
    assert missing == ["n2"]


def test_a_stepd_report_names_busy_nodes_apart_from_those_that_checked() -> None:
    busy, reported = parse_stepd_lines("hpr-stepd n2 3\nhpr-stepd-checked n1\nhpr-stepd-checked n2\nhpr-stepd n3\n")
    assert busy == {"n2"} and reported == {"n1", "n2"}  # "hpr-stepd n3" names no step: not a report


def test_notice_and_live_reports_keep_only_well_formed_lines() -> None:
    assert parse_notice_lines("hpr-notice n1\nhpr-notice\nnoise hpr-notice n3\n") == {"n1"}
    assert parse_live_lines("hpr-live n1 2\nhpr-live n2 x\nhpr-live n3 " + "9" * 12 + "\n") == {"n1": 2}


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
