"""Packaging facts an operator relies on: the declared Python is the one the code and CI run on, the license
file exists, and no setting is accepted only to be ignored."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from hpresilience.config import config_from_mapping
from hpresilience.errors import ConfigError
from hpresilience.install.layout import MIN_PYTHON

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_declared_python_is_the_lowest_the_code_and_ci_run_on() -> None:
    """log.py needs 3.11 (logging.getLevelNamesMapping); CI runs Debian 12's 3.11; the installer checks it."""
    m = re.fullmatch(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert m and (int(m.group(1)), int(m.group(2))) == MIN_PYTHON
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{MIN_PYTHON[0]}{MIN_PYTHON[1]}"
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}"
    assert sys.version_info[:2] >= MIN_PYTHON


def test_license_file_matches_the_metadata() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_slurm_backend_auto_is_refused_not_ignored() -> None:
    with pytest.raises(ConfigError, match=r"cfg.yaml: slurm.backend: Input should be 'commands'"):
        config_from_mapping({"slurm": {"backend": "auto"}}, "cfg.yaml")
    assert config_from_mapping({"slurm": {"backend": "commands"}}).slurm.backend == "commands"
