"""The CLI: exit codes that mean something, one clear line on stderr for each kind of mistake."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hpresilience import __version__


def hpr(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpresilience", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_version() -> None:
    res = hpr("--version")
    assert res.returncode == 0 and __version__ in res.stdout


def test_every_command_has_help() -> None:
    from hpresilience.cli import LAZY_COMMANDS

    for cmd in [[name] for name in LAZY_COMMANDS] + [["devcluster", "up"], ["config", "show"]]:
        res = hpr(*cmd, "--help")
        assert res.returncode == 0, (cmd, res.stderr)
        assert "Usage:" in res.stdout


def test_unknown_option_is_one_line_and_exit_2() -> None:
    res = hpr("devcluster", "up", "--nodez", "3")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "No such option '--nodez'" in lines[0] and "devcluster up --help" in lines[0]


def test_garbage_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("agent: {{{{\n")
    res = hpr("--config", str(p), "config", "show")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(p) in lines[0] and "not valid YAML" in lines[0]
    assert "Traceback" not in res.stderr


def test_config_show_json_reflects_the_file(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm: {retries: 2}\n")
    res = hpr("--json", "--config", str(p), "config", "show")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["slurm"]["retries"] == 2


def test_verbose_shows_traceback(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("nope: 1\n")
    res = hpr("--verbose", "--config", str(p), "config", "show")
    assert res.returncode == 2 and "Traceback" in res.stderr and "nope: unknown key" in res.stderr


def test_goodput_with_a_bad_since_is_one_line_and_exit_2() -> None:
    res = hpr("goodput", "--since", "7days")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--since '7days'" in res.stderr and "7d" in res.stderr


def test_job_with_a_bad_job_id_is_exit_2() -> None:
    res = hpr("job", "abc")
    assert res.returncode == 2 and "JOB_ID" in res.stderr
