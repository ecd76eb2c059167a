"""Fixtures for the health checks: contexts rooted in temporary copies of recorded trees, fake tools."""

from __future__ import annotations

import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpresilience.health.base import CheckContext, CheckResult, HostPaths
from hpresilience.health.settings import HealthSettings
from hpresilience.health.verdict import Verdict
from hpresilience.testing.fakenode import FakeNode

FIXTURES = Path(__file__).parent.parent / "fixtures" / "health"


def make_ctx(root: Path, **kw: object) -> CheckContext:
    paths = HostPaths(root / "sys", root / "proc", root / "dev")
    for p in (paths.sysfs, paths.procfs, paths.dev):
        p.mkdir(parents=True, exist_ok=True)
    ctx = CheckContext(paths=paths, state_dir=root / "state", **kw)  # type: ignore[arg-type]
    return ctx


@pytest.fixture()
def ctx_factory(tmp_path: Path) -> Callable[..., CheckContext]:
    def factory(**kw: object) -> CheckContext:
        return make_ctx(tmp_path / "node", **kw)

    return factory


@pytest.fixture()
def tree(tmp_path: Path) -> Callable[[str, str], Path]:
    """Copy a recorded tree from tests/fixtures/health into the node root (e.g. sysfs-efa -> node/sys)."""

    def copy(name: str, into: str = "sys") -> Path:
        dst = tmp_path / "node" / into
        shutil.copytree(FIXTURES / name, dst, dirs_exist_ok=True)
        return dst

    return copy


@pytest.fixture()
def fake_tool(tmp_path: Path) -> Callable[[str, str], str]:
    """Write an executable shell script standing in for an external tool; returns its path."""

    def write(name: str, body: str) -> str:
        p = tmp_path / "bin" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("#!/bin/sh\n" + body + "\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return str(p)

    return write


@pytest.fixture()
def p5(tmp_path: Path) -> FakeNode:
    """A healthy p5.48xlarge (2 of its 32 EFA devices: the GPU and XID tests do not look at EFA)."""
    return FakeNode.make(tmp_path / "p5", "p5.48xlarge", efa=2)


def node_settings(node: FakeNode, **checks: Any) -> HealthSettings:
    from hpresilience.config import load_config

    hs = load_config(node.root / "config.yaml").health
    return hs.model_copy(update={"checks": {**hs.checks, **checks}})


def run_node(node: FakeNode, names: list[str], **checks: Any) -> tuple[dict[str, CheckResult], Verdict]:
    """Run the named checks of the node's profile against its fake hardware; results by check name."""
    from hpresilience.health.api import run_profile

    _, results, verdict = run_profile(node_settings(node, **checks), only=names)
    return {r.check: r for r in results}, verdict
