"""Configuration: defaults with no file, one clear line per mistake naming file and key path."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hpresilience.config import Config, load_config
from hpresilience.errors import ConfigError


def test_defaults_work_without_any_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPRESILIENCE_CONFIG", raising=False)
    cfg = load_config(None)
    assert cfg == Config() and cfg.slurm.command_timeout_s == 30.0 and cfg.devcluster.nodes == 4


def test_values_are_read_and_frozen(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm:\n  command_timeout_s: 5\ndevcluster:\n  overrides: {SlurmdTimeout: '5'}\n")
    cfg = load_config(p)
    assert cfg.slurm.command_timeout_s == 5 and cfg.devcluster.overrides == {"SlurmdTimeout": "5"}
    with pytest.raises(ValidationError):
        cfg.slurm.command_timeout_s = 1  # type: ignore[misc]


def test_unknown_key_names_file_and_path(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm:\n  comand_timeout_s: 5\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert str(exc.value) == f"{p}: slurm.comand_timeout_s: unknown key"


def test_wrong_type_says_what_was_expected(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm:\n  retries: many\n")
    with pytest.raises(ConfigError, match=r"slurm\.retries: Input should be a valid integer"):
        load_config(p)


def test_garbage_yaml_gives_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm: [unclosed\n  : :\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+, column \d+"):
        load_config(p)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(p)


def test_missing_file_is_an_error_not_defaults(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_config(tmp_path / "nope.yaml")
