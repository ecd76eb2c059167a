"""The systemd units as installed: valid, hardened, and not restarted forever on a configuration error."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpresilience.install.layout import AGENT_UNIT, CONTROLLER_UNIT, SHM_UNIT, Layout, render
from tests.install.conftest import Installed

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (apt-get install -y systemd)"
)


def rendered(tmp_path: Path, unit: str) -> Path:
    p = tmp_path / unit
    p.write_text(render(unit, Layout(tmp_path / "root")))
    return p


def exposure(unit: Path) -> float:
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True, text=True, timeout=60
    ).stdout
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out)
    assert m, out
    return float(m.group(1))


@needs_systemd_analyze
@pytest.mark.parametrize(("unit", "limit"), [(AGENT_UNIT, 7.0), (CONTROLLER_UNIT, 3.0)])
def test_units_are_hardened(tmp_path: Path, unit: str, limit: float) -> None:
    """systemd-analyze security rated both units 9.6 UNSAFE; now MEDIUM or better (the agent needs devices,
    the kernel log and root for scontrol; the controller only Slurm and the network)."""
    assert exposure(rendered(tmp_path, unit)) < limit


@needs_systemd_analyze
def test_installed_units_verify_clean(compute_root: Installed, head_root: Installed) -> None:
    """systemd-analyze verify on the units as installed (their ExecStart binaries exist there)."""
    for unit in (compute_root.unit(AGENT_UNIT), compute_root.unit(SHM_UNIT), head_root.unit(CONTROLLER_UNIT)):
        res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
        problems = [ln for ln in res.stderr.splitlines() if unit.name in ln]
        assert res.returncode == 0 and not problems, res.stderr


@pytest.mark.parametrize("unit", [AGENT_UNIT, CONTROLLER_UNIT])
def test_a_config_error_is_not_restarted(tmp_path: Path, unit: str) -> None:
    """Exit 2 (configuration error) is excluded from Restart=on-failure: no crash loop every few seconds."""
    text = rendered(tmp_path, unit).read_text()
    assert re.search(r"^RestartPreventExitStatus=.*\b2\b", text, re.M)
    assert re.search(r"^Restart=on-failure$", text, re.M)


@pytest.mark.parametrize(("unit", "extra"), [(AGENT_UNIT, ["--once"]), (CONTROLLER_UNIT, ["--once"])])
def test_exec_start_with_a_bad_config_exits_2(tmp_path: Path, unit: str, extra: list[str]) -> None:
    """The ExecStart command line with a broken config file exits 2, the code the unit does not restart."""
    layout = Layout(tmp_path / "root")
    layout.config.parent.mkdir(parents=True)
    layout.config.write_text("agent:\n  bogus: 1\n")
    argv = shlex.split(next(ln for ln in render(unit, layout).splitlines() if ln.startswith("ExecStart="))[10:])
    # The venv is not built here: run the same arguments with this interpreter's package.
    res = subprocess.run(
        [sys.executable, "-m", "hpresilience", *argv[1:], *extra], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "agent.bogus: unknown key" in res.stderr


def mount_option(mountpoint: Path, name: str) -> str | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[1] == str(mountpoint):
            found = [o.partition("=")[2] for o in fields[3].split(",") if o.partition("=")[0] == name]
            return found[0] if found else None
    return None


def test_the_shm_unit_turns_huge_pages_on_for_the_tmpfs_and_its_stop_turns_them_off(tmp_path: Path) -> None:
    """The unit's own ExecStart and ExecStop, run against a private tmpfs in place of /dev/shm: huge pages
    within_size after the start (what makes a restore from the memory tier run at memcpy speed), none after the
    stop."""
    text = render(SHM_UNIT, Layout(tmp_path / "root"))
    commands = {
        key: shlex.split(ln.split("=", 1)[1])
        for ln in text.splitlines()
        for key in ("ExecStart", "ExecStop")
        if ln.startswith(f"{key}=")
    }
    assert commands["ExecStart"][-1] == commands["ExecStop"][-1] == "/dev/shm"
    target = tmp_path / "shm"
    target.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "hpr-test", str(target)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        for key, want in (("ExecStart", "within_size"), ("ExecStop", None)):
            argv = [*commands[key][:-1], str(target)]
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
            assert mount_option(target, "huge") == want, Path("/proc/mounts").read_text()
    finally:
        subprocess.run(["umount", str(target)], check=False, timeout=30)
