"""Which processes belong to a devcluster (hpresilience/testing/devprocs.py), on stand-in process objects: the
scan's rules, without starting a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from hpresilience.testing import devprocs


class Proc:
    """What cluster_processes reads of a process; `environ` refused when None (psutil.AccessDenied)."""

    def __init__(self, pid: int, name: str, cmdline: list[str], environ: dict[str, str] | None) -> None:
        self.pid, self._name, self._cmdline, self._environ = pid, name, cmdline, environ

    def environ(self) -> dict[str, str]:
        if self._environ is None:
            raise psutil.AccessDenied(self.pid)
        return self._environ

    def name(self) -> str:
        return self._name

    def cmdline(self) -> list[str]:
        return self._cmdline

    def cwd(self) -> str:
        return "/"

    def children(self, recursive: bool = False) -> list[Any]:
        return []


def scan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, procs: list[Proc]) -> set[int]:
    monkeypatch.setattr(psutil, "process_iter", lambda attrs=None: iter(procs))
    return {p.pid for p in devprocs.cluster_processes(tmp_path)}


def test_a_slurmd_whose_environment_is_refused_is_still_ours_by_its_slurm_conf(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    conf = str(tmp_path / "slurm.conf")
    procs = [
        Proc(101, "slurmd", ["/usr/sbin/slurmd", "-f", conf, "-N", "n3"], None),
        Proc(102, "slurmd", ["/usr/sbin/slurmd", "-f", "/elsewhere/slurm.conf", "-N", "n3"], None),
        Proc(103, "python", ["python", "x.py"], {devprocs.MARKER: str(tmp_path)}),
        Proc(104, "python", ["python", "y.py"], {devprocs.MARKER: "/another/cluster"}),
    ]
    assert scan(monkeypatch, tmp_path, procs) == {101, 103}
