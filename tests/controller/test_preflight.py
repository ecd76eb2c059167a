"""Integration: the controller checks at start what its providers and gate need from the running cluster, and
refuses to start (exit 2, one line) when something is missing; the installer prints the slurm.conf lines."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpresilience.cli import main
from hpresilience.config import load_config
from hpresilience.controller.preflight import preflight
from hpresilience.controller.settings import ControllerSettings
from hpresilience.install.installer import lay_out
from hpresilience.install.layout import Layout
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.reservations import reservation_rights_problem
from hpresilience.slurm.runner import CommandRunner
from hpresilience.testing.devcluster import DevCluster
from tests.conftest import TEST_BASE_PORT, require_slurm

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rebooting_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A one-node cluster whose slurmctld has a RebootProgram (the session cluster has none)."""
    require_slurm()
    cl = DevCluster(
        state_dir=tmp_path_factory.mktemp("rebooting") / "cluster",
        nodes=1,
        base_port=TEST_BASE_PORT + 500,
        accounting=False,
        overrides={"RebootProgram": "/bin/true"},
    )
    cl.up(timeout=60)
    yield cl
    cl.down()


def controller_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: DevCluster, body: str) -> int:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf_path))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"controller:\n  state_dir: {tmp_path / 'state'}\n  metrics_address: ''\n" + body)
    return main(["--config", str(cfg), "controller", "--once"])


def test_reboot_provider_without_a_rebootprogram_stops_the_controller_at_start(
    cluster: DevCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default provider on a cluster whose slurmctld has no RebootProgram: every repair would have been a
    provider error climbing the ladder to given_up. Now: exit 2 before the first cycle, one line."""
    rc = controller_once(tmp_path, monkeypatch, cluster, "  gate: {kind: none}\n")
    err = capsys.readouterr().err
    assert rc == 2
    [line] = [ln for ln in err.splitlines() if "RebootProgram" in ln]
    assert "provider reboot (default_provider) needs RebootProgram" in line and "RebootProgram=/sbin/reboot" in line
    assert "controller_started" not in err


def test_reboot_provider_with_a_rebootprogram_starts(
    rebooting_cluster: DevCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = controller_once(tmp_path, monkeypatch, rebooting_cluster, "  gate: {kind: none}\n")
    err = capsys.readouterr().err
    assert rc == 0 and "controller_started" in err and "RebootProgram" not in err


def test_every_missing_piece_is_named_in_one_line(
    cluster: DevCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A group's script that is not there and a command gate whose tool is not there, together."""
    rc = controller_once(
        tmp_path,
        monkeypatch,
        cluster,
        (
            "  default_provider: script\n"
            f"  default_options: {{command: [{tmp_path / 'no-such-ipmi'}]}}\n"
            f"  gate: {{kind: command, command: [{tmp_path / 'no-ssh'}, '{{address}}']}}\n"
        ),
    )
    err = capsys.readouterr().err
    assert rc == 2
    [line] = [ln for ln in err.splitlines() if "cannot work on this cluster" in ln]
    assert f"provider script (default_provider): {tmp_path / 'no-such-ipmi'} is not an executable file" in line
    assert f"gate command: {tmp_path / 'no-ssh'} is not an executable file" in line


def test_slurm_gate_reservation_rights_are_read_from_the_cluster(cluster: DevCluster, slurm: SlurmClient) -> None:
    """root (and SlurmUser) may create reservations; a user without AdminLevel in slurmdbd may not."""
    config = slurm.config()
    assert reservation_rights_problem(slurm, "root", 0, config) is None
    problem = reservation_rights_problem(slurm, "nobody", 65534, config)
    assert problem is not None and "nobody" in problem and "Operator" in problem
    settings = ControllerSettings.model_validate(
        {"default_provider": "script", "default_options": {"command": [sys.executable]}}
    )
    assert preflight(settings, slurm, user="root", uid=0) == []
    [gate_problem] = preflight(settings, slurm, user="nobody", uid=65534)
    assert gate_problem.startswith("gate slurm needs to create maintenance reservations: user nobody")


def test_slurm_gate_needs_srun_on_the_controller_host(cluster: DevCluster, tmp_path: Path) -> None:
    """The controller's host has scontrol but no srun (not a submit host): the gate could never run its job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").symlink_to(shutil.which("scontrol") or "scontrol")
    client = SlurmClient(CommandRunner(str(bin_dir), timeout=15, retries=1, env=cluster.env()))
    settings = ControllerSettings.model_validate(
        {"default_provider": "script", "default_options": {"command": [sys.executable]}}
    )
    [problem] = preflight(settings, client, user="root", uid=0)
    assert (
        problem == f"gate slurm runs its job with srun: {bin_dir / 'srun'} is not an executable file (this host "
        "must be a Slurm submit host)"
    )


@pytest.mark.parametrize(("provider", "wanted"), [("reboot", True), ("script", False)])
def test_installer_prints_the_slurm_conf_lines_the_provider_needs(tmp_path: Path, provider: str, wanted: bool) -> None:
    layout = Layout(tmp_path / "root")
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("ClusterName=c\nReturnToService=1\n")
    config = tmp_path / "config.yaml"
    options = "" if provider == "reboot" else f"\n  default_options: {{command: [{sys.executable}]}}"
    config.write_text(f"controller:\n  default_provider: {provider}{options}\n")
    load_config(config)
    report = lay_out(
        layout, "controller", config=str(config), package_changed=False, use_systemd=False, slurm_conf=str(slurm_conf)
    )
    assert ("RebootProgram=/sbin/reboot" in report.slurm_lines) is wanted
    slurm_conf.write_text("RebootProgram=/usr/local/sbin/site-reboot\n")
    report = lay_out(
        layout, "controller", config=str(config), package_changed=False, use_systemd=False, slurm_conf=str(slurm_conf)
    )
    assert not any(ln.startswith("RebootProgram") for ln in report.slurm_lines)  # the site's own is kept
    assert os.path.isdir(layout.state_dir("controller"))
