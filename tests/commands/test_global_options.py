"""--json, -v/--verbose and --config after the subcommand, as people type them (`hpresilience check --json`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpresilience.cli import main


def test_check_json_after_the_subcommand(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["check", "--json", "--profile", "generic", "--state-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "verdict" in json.loads(out)


def test_config_and_json_after_a_nested_subcommand(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm: {retries: 3}\n")
    rc = main(["config", "show", "--config", str(p), "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["slurm"]["retries"] == 3


def test_a_commands_own_option_keeps_its_meaning(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`install --config` is the file to install, validated first: not the global one."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("nope: 1\n")
    whl = tmp_path / "hpresilience-0.0.0-py3-none-any.whl"
    whl.write_bytes(b"")
    rc = main(["install", "--role", "login", "--root", str(tmp_path / "r"), "--config", str(bad), "--wheel", str(whl)])
    assert rc == 2 and f"{bad}: nope: unknown key" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_srun_arguments_are_left_alone() -> None:
    """srun's own words pass through: no global option is added to the srun hand-over."""
    import click

    from hpresilience.cli import cli

    cmd = cli.get_command(click.Context(cli), "srun")
    assert cmd is not None and not any("--json" in getattr(p, "opts", []) for p in cmd.params)
