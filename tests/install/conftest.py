"""A wheel built once per session from this tree, and throwaway roots installed from it."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A login shell's PATH on Debian (/etc/profile, a non-root user), before /etc/profile.d adds anything.
LOGIN_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"


@dataclass
class Installed:
    root: Path
    outputs: list[subprocess.CompletedProcess[str]]

    @property
    def prefix(self) -> Path:
        return self.root / "opt" / "hpresilience"

    @property
    def config(self) -> Path:
        return self.root / "etc" / "hpresilience" / "config.yaml"

    def unit(self, name: str) -> Path:
        return self.root / "etc" / "systemd" / "system" / name


def hpr_install(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`hpresilience install ...` as an admin types it, from the development venv's package."""
    return subprocess.run(
        [sys.executable, "-m", "hpresilience", "install", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Each xdist worker has its own session, and setuptools builds in the tree (build/, *.egg-info): two workers
    # building at once broke one build in CI. One build at a time per checkout: the lock lies in the checkout's
    # build/ (ignored by git; a lock in /tmp stayed there after every run).
    lock = REPO / "build" / ".hpr-wheel.lock"
    lock.parent.mkdir(exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        res = subprocess.run(
            [*PIP_WHEEL, "-w", str(out), str(REPO)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    (whl,) = out.glob("hpresilience-*.whl")
    return whl


@pytest.fixture(scope="session")
def compute_root(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Installed:
    """A compute node's install with no --config (the defaults are written), from the wheel."""
    root = tmp_path_factory.mktemp("compute-root")
    res = hpr_install("--role", "compute", "--root", str(root), "--wheel", str(wheel))
    assert res.returncode == 0, res.stdout + res.stderr
    return Installed(root, [res])


@pytest.fixture(scope="session")
def head_root(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Installed:
    """A head node: login role, then controller role, into the same root (the second reuses the venv)."""
    root = tmp_path_factory.mktemp("head-root")
    outs = []
    for role in ("login", "controller"):
        res = hpr_install("--role", role, "--root", str(root), "--wheel", str(wheel))
        assert res.returncode == 0, res.stdout + res.stderr
        outs.append(res)
    return Installed(root, outs)
