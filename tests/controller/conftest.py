"""Controller test helpers: a provider script that restarts a devcluster node's slurmd (the devcluster's
"replace"), and a health-gate script whose verdict per node the test writes into a file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hpresilience.controller.loop import Controller
from hpresilience.controller.settings import ControllerSettings
from hpresilience.slurm.parse import parse_job_id
from hpresilience.testing.devcluster import DevCluster


@dataclass
class Scripts:
    root: Path
    provider: Path
    gate: Path

    @property
    def calls(self) -> list[str]:
        p = self.root / "provider_calls.log"
        return p.read_text().split("\n")[:-1] if p.exists() else []

    @property
    def gate_calls(self) -> list[str]:
        p = self.root / "gate_calls.log"
        return p.read_text().split("\n")[:-1] if p.exists() else []

    def set_gate(self, node: str, verdict: str) -> None:
        (self.root / f"gate-{node}").write_text(verdict)


def write_scripts(root: Path, cluster: DevCluster, provider_delay_s: float = 0.0) -> Scripts:
    root.mkdir(parents=True, exist_ok=True)
    provider = root / "provider.sh"
    provider.write_text(
        "#!/bin/sh\n"
        f'echo "$1 $2" >> "{root}/provider_calls.log"\n'
        f"sleep {provider_delay_s}\n"
        f'exec "{sys.executable}" -m hpresilience devcluster restart-node "$1" --state-dir "{cluster.state_dir}"\n'
    )
    gate = root / "gate.sh"
    gate.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> "{root}/gate_calls.log"\n'
        f'v=$(cat "{root}/gate-$1" 2>/dev/null || echo pass)\n'
        'echo "gate for $1: $v"\n'
        '[ "$v" = pass ]\n'
    )
    provider.chmod(0o755)
    gate.chmod(0o755)
    return Scripts(root, provider, gate)


def settings_for(scripts: Scripts, state_dir: Path, **changes: Any) -> ControllerSettings:
    data: dict[str, Any] = {
        "poll_interval_s": 0.3,
        "state_dir": str(state_dir),
        "forced_down_after_s": 1.5,
        "come_back_timeout_s": 20,
        "metrics_address": "",
        "default_provider": "script",
        "default_options": {"command": [str(scripts.provider)], "timeout_s": 60},
        "gate": {"kind": "command", "command": [str(scripts.gate), "{node}"], "timeout_s": 30},
    }
    data.update(changes)
    return ControllerSettings.model_validate(data)


@pytest.fixture()
def scripts(tmp_path: Path, cluster: DevCluster) -> Scripts:
    return write_scripts(tmp_path / "scripts", cluster)


@pytest.fixture()
def start_controller() -> Iterator[Callable[[Controller], Controller]]:
    """Runs controllers in background threads; stops and joins them at the end of the test."""
    running: list[tuple[Controller, threading.Thread]] = []

    def start(ctl: Controller) -> Controller:
        t = threading.Thread(target=ctl.run, name="controller", daemon=True)
        t.start()
        running.append((ctl, t))
        return ctl

    yield start
    for ctl, t in running:
        ctl.stop()
        t.join(timeout=30)


NOBODY = 65534


@dataclass
class Nobody:
    """Submits jobs as the ordinary user `nobody` (uid 65534) to the devcluster: what any user of a shared
    cluster can do. `public` is a root-owned folder (0755) with a copy of slurm.conf nobody can read."""

    public: Path
    env: dict[str, str]

    def run(self, *argv: str, cwd: Path | None = None) -> str:
        res = subprocess.run(
            argv,
            env=self.env,
            cwd=cwd or self.public,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0, f"{argv[0]} as nobody: {res.stderr.strip()}"
        return res.stdout + res.stderr

    def sbatch(self, *args: str) -> int:
        """A batch job (it cannot run: the devcluster's spool is not nobody's to read; pending ones serve)."""
        return parse_job_id(self.run("sbatch", "--parsable", "-o", "/dev/null", *args))

    def salloc(self, *args: str, cwd: Path | None = None) -> int:
        """A running job without a batch script (`salloc --no-shell`): its WorkDir is `cwd`."""
        return parse_job_id(self.run("salloc", "--no-shell", *args, cwd=cwd))

    def folder(self, name: str) -> Path:
        """A folder of nobody's own, named as they like (newlines and all)."""
        path = self.public / name
        path.mkdir()
        os.chown(path, NOBODY, NOBODY)
        return path


@pytest.fixture()
def nobody(cluster: DevCluster) -> Iterator[Nobody]:
    # Under /tmp, not tmp_path: pytest's folders are 0700, which nobody cannot pass through.
    public = Path(tempfile.mkdtemp(prefix="hpr-nobody-", dir="/tmp"))
    public.chmod(0o755)
    conf = public / "slurm.conf"
    shutil.copyfile(cluster.env()["SLURM_CONF"], conf)
    conf.chmod(0o644)
    yield Nobody(public, dict(cluster.env(), SLURM_CONF=str(conf)))
    shutil.rmtree(public, ignore_errors=True)


def wait_until(probe: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def history(state_dir: Path) -> list[dict[str, Any]]:
    p = state_dir / "history.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
