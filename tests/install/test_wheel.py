"""The built wheel carries every file the installer lays out, and the license."""

from __future__ import annotations

import tomllib
import zipfile
from pathlib import Path

from tests.install.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_wheel_carries_the_installed_files_and_the_license(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in (
        "srun",
        "healthcheck.sh",
        "epilog.sh",
        "slurm.conf.hpresilience",
        "hpresilience-agent.service",
        "hpresilience-controller.service",
        "hpresilience-shm-hugepages.service",
    ):
        assert f"hpresilience/install/data/{f}" in names
    assert any(n.endswith("/licenses/LICENSE") for n in names)
    # Every package-data glob matches something (a glob matching nothing once hid missing files).
    for glob in PYPROJECT["tool"]["setuptools"]["package-data"]["hpresilience"]:
        assert list((REPO / "hpresilience").glob(glob)), glob
