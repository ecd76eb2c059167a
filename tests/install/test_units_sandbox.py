"""The daemons as their units run them: every default write path inside the unit's writable paths, and each
unit's ExecStart run inside its file-system sandbox (emulated with a mount namespace, tests/install/sandbox.py:
systemd is not PID 1 here) against the real local cluster: the agent saves its state, the controller repairs
a node through its health gate, and what they must read (root's ssh key, ~/.aws) is not hidden."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from hpresilience.config import Config, config_from_mapping
from hpresilience.install.layout import AGENT_UNIT, CONTROLLER_UNIT, Layout, default_config, render
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.fakenode import FakeNode
from tests.controller.conftest import wait_until
from tests.install import sandbox
from tests.install.conftest import Installed

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
# This machine's Python lives under /root (pyenv), which ProtectHome hides; a production venv's is in /usr.
PYTHON_HOME = Path(sys.base_prefix)


def under(path: str, dirs: list[Path]) -> bool:
    return any(Path(path).resolve().is_relative_to(d.resolve()) for d in dirs)


def default_writes(cfg: Config) -> dict[str, list[str]]:
    """What each daemon writes with this configuration."""
    return {AGENT_UNIT: [cfg.agent.state_dir, cfg.health.state_dir], CONTROLLER_UNIT: [cfg.controller.state_dir]}


@pytest.mark.parametrize("installed", [False, True])
def test_every_path_a_daemon_writes_by_default_is_writable_under_its_unit(tmp_path: Path, installed: bool) -> None:
    """Issue 21 defect 2: the agent unit let the agent write only agent.state_dir, while health.state_dir (XID
    escalation, counter baselines, the driver-change grace) defaulted elsewhere: every cycle lost that state.
    Checked for the built-in defaults (root /) and for the config `install` writes (under --root)."""
    root = tmp_path / "root" if installed else Path("/")
    layout = Layout(root)
    cfg = config_from_mapping(yaml.safe_load(default_config(layout))) if installed else Config()
    for unit, paths in default_writes(cfg).items():
        writable = sandbox.writable_paths(render(unit, layout), root)
        for p in paths:
            assert under(p, writable), f"{unit} leaves {p} read-only (writable: {writable})"


def agent_config(tmp_path: Path, installed: Installed, node: FakeNode) -> Path:
    """The installed default config, the agent pointed at a fake p5 node's hardware (its state dirs as installed)."""
    data = yaml.safe_load(installed.config.read_text())
    health = yaml.safe_load((node.root / "config.yaml").read_text())["health"]
    health.pop("state_dir")
    data["health"] = {**health, **data.get("health", {})}
    data.setdefault("agent", {}).update(metrics_address="", node_name="n1")
    cfg = tmp_path / "etc" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text(yaml.safe_dump(data))
    return cfg


def with_config(argv: list[str], config: Path) -> list[str]:
    """The unit's ExecStart with the test's config file in place of the installed one."""
    i = argv.index("--config")
    return [*argv[: i + 1], str(config), *argv[i + 2 :]]


@needs_root
@pytest.mark.integration
@pytest.mark.parametrize("unit_text", ["shipped", "without health StateDirectory"])
def test_agent_exec_start_saves_its_state_inside_its_sandbox(
    compute_root: Installed, cluster: DevCluster, tmp_path: Path, unit_text: str
) -> None:
    """The agent as its unit starts it (ProtectSystem=strict, ProtectHome, PrivateTmp, StateDirectory), one
    cycle on a fake p5 whose kernel log has XID 79: the repeat streak and the XID escalation history land in
    the unit's state directories. A unit that leaves health.state_dir read-only (as shipped before) stops the
    agent at start with one line, instead of losing the escalation on every cycle."""
    text = compute_root.unit(AGENT_UNIT).read_text()
    if unit_text != "shipped":
        text = text.replace(
            "StateDirectory=hpresilience/agent hpresilience/health", "StateDirectory=hpresilience/agent"
        )
    node = FakeNode.make(tmp_path / "p5", "p5.48xlarge", efa=2)
    node.inject("xid:79")
    cfg = agent_config(tmp_path, compute_root, node)
    argv = [*with_config(sandbox.exec_start(text), cfg), "--once"]
    keep = [compute_root.root, tmp_path, cluster.state_dir, PYTHON_HOME]
    res = subprocess.run(
        sandbox.command(text, compute_root.root, keep, argv),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SLURM_CONF": str(cluster.conf_path)},
    )
    state = compute_root.root / "var/lib/hpresilience"
    if unit_text == "shipped":
        assert res.returncode == 0, res.stderr[-2000:]
        assert json.loads((state / "agent" / "agent-n1.json").read_text())["streaks"]
        escalation = json.loads((state / "health" / "escalation.json").read_text())
        assert any(":79:" in key for key in escalation["faults"]), escalation
        assert "agent_state_not_saved" not in res.stderr
    else:
        assert res.returncode == 2
        [line] = res.stderr.strip().splitlines()
        assert f"cannot write health.state_dir {state / 'health'} (Read-only file system)" in line


@needs_root
def test_controller_that_cannot_write_its_state_stops_at_start_with_one_line(
    head_root: Installed, tmp_path: Path
) -> None:
    """The controller unit without its StateDirectory (or a state_dir moved outside it): exit 2 (not restarted
    by the unit) with one line naming the key, before any Slurm call."""
    text = head_root.unit(CONTROLLER_UNIT).read_text().replace("StateDirectory=hpresilience/controller\n", "")
    state = head_root.root / "var/lib/hpresilience/controller"
    res = subprocess.run(
        sandbox.command(text, head_root.root, [head_root.root, PYTHON_HOME], [*sandbox.exec_start(text), "--once"]),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SLURM_CONF": "/nonexistent"},
    )
    assert res.returncode == 2, res.stderr
    [line] = res.stderr.strip().splitlines()
    assert f"cannot write controller.state_dir {state} (Read-only file system)" in line


@needs_root
def test_controller_unit_leaves_root_credentials_readable(head_root: Installed) -> None:
    """Issue 21 defect 1: ProtectHome=yes hid /root/.ssh (the ssh gate's key and known_hosts) and /root/.aws
    (boto3's credentials) from the controller. A file under /root is readable inside the shipped unit's
    sandbox, and read-only there; with ProtectHome=yes it was not there at all."""
    text = head_root.unit(CONTROLLER_UNIT).read_text()
    with tempfile.NamedTemporaryFile("w", dir="/root", prefix=".hpr-test-credential-") as f:
        f.write("secret\n")
        f.flush()
        script = f'cat "{f.name}" && ! touch "{f.name}" 2>/dev/null'
        for unit, readable in ((text, True), (text.replace("ProtectHome=read-only", "ProtectHome=yes"), False)):
            res = subprocess.run(
                sandbox.command(unit, head_root.root, [PYTHON_HOME], ["sh", "-c", script]),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert (res.returncode == 0 and res.stdout == "secret\n") is readable, (unit, res.stderr)


@needs_root
@pytest.mark.integration
def test_controller_exec_start_repairs_a_node_through_the_slurm_gate_inside_its_sandbox(
    head_root: Installed, cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """The controller daemon as its unit starts it, with the default gate kind: it keeps its records in its
    StateDirectory, reserves the repaired node, runs the gate job there, keeps the job's output, resumes."""
    text = head_root.unit(CONTROLLER_UNIT).read_text()
    state = head_root.root / "var/lib/hpresilience/controller"
    job = tmp_path / "gate_job.py"
    job.write_text("print('gate job: healthy')\n")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "controller": {
                    "state_dir": str(state),
                    "poll_interval_s": 0.3,
                    "metrics_address": "",
                    "come_back_timeout_s": 60,
                    "release_requeued_every_s": 0,
                    # The provider only says it acted; the test restarts n2's slurmd from outside the sandbox (a slurmd
                    # started inside would live on in the namespace's read-only file system).
                    "default_provider": "script",
                    "default_options": {"command": ["/bin/true"]},
                    "gate": {"kind": "slurm", "job_command": [sys.executable, str(job)], "timeout_s": 60},
                }
            }
        )
    )
    argv = with_config(sandbox.exec_start(text), cfg)
    keep = [head_root.root, tmp_path, cluster.state_dir, PYTHON_HOME]
    daemon = subprocess.Popen(
        sandbox.command(text, head_root.root, keep, argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "SLURM_CONF": str(cluster.conf_path)},
    )
    try:
        slurm.set_node_state(["n2"], "fail", "Action:Replace")
        record = state / "nodes" / "n2.json"
        wait_until(
            lambda: record.exists() and json.loads(record.read_text())["step"] == "waiting_back",
            "the controller to act on n2",
            30,
        )
        cluster.restart_node("n2")
        history = state / "history.jsonl"
        wait_until(lambda: history.exists() and "n2" in history.read_text(), "the repair of n2 to finish", 60)
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=30)
    [done] = [json.loads(line) for line in history.read_text().splitlines() if '"n2"' in line]
    assert done["outcome"] == "repaired", out[-3000:]
    assert "gate job exit 0: gate job: healthy" in done["last_health"]["detail"]
    assert list((state / "gates").glob("n2-*.json"))
    assert daemon.returncode == 0, out[-3000:]


def test_the_agent_unit_gives_the_notice_file_a_root_owned_directory_users_can_read(tmp_path: Path) -> None:
    """Issue 25: the agent writes the node notice file under /run/hpresilience, which ProtectSystem=strict
    leaves read-only unless the unit makes it its RuntimeDirectory; 0755 so that ranks (users) can see the
    file and only root can write there, kept across an agent restart."""
    d = sandbox.directives(render(AGENT_UNIT, Layout(tmp_path)))
    notice_dir = Path(Config().agent.notices.notice_file).parent
    assert [Path("/run") / name for v in d["RuntimeDirectory"] for name in v.split()] == [notice_dir]
    assert d["RuntimeDirectoryMode"] == ["0755"] and d["RuntimeDirectoryPreserve"] == ["yes"]
