"""`hpresilience status` where the controller never ran says so, instead of "no node under repair"."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.cli import main


def test_status_without_controller_state_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["status", "--state-dir", str(tmp_path / "ctl")])
    err = capsys.readouterr().err
    assert rc == 1 and f"no controller state in {tmp_path / 'ctl'}" in err and "no node under repair" not in err


def test_status_with_an_empty_record_set_reports_none_under_repair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nodes").mkdir()
    rc = main(["status", "--state-dir", str(tmp_path)])
    assert rc == 0 and "(no node under repair)" in capsys.readouterr().out
