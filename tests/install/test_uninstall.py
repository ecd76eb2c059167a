"""`hpresilience uninstall --role R` removes what install-manifest.json lists for R, and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hpresilience.install.installer import lay_out
from hpresilience.install.layout import Layout


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def uninstall(root: Path, role: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hpresilience",
            "--json",
            "uninstall",
            "--role",
            role,
            "--root",
            str(root),
            "--no-systemd",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_install_then_uninstall_each_role_leaves_nothing_install_wrote(tmp_path: Path) -> None:
    """compute + login into one root; uninstalling compute removes its unit and healthcheck.sh but keeps what
    login also uses (shim, CLI link, config, PATH entry); uninstalling login then removes the rest and the
    manifest, and names the state directory it leaves."""
    layout = Layout(tmp_path)
    before = files_under(tmp_path)
    for role in ("compute", "login"):
        lay_out(layout, role, config=None, package_changed=False, use_systemd=False, slurm_conf=None)
    installed = files_under(tmp_path) - before
    assert "etc/systemd/system/hpresilience-agent.service" in installed
    assert "etc/systemd/system/hpresilience-shm-hugepages.service" in installed
    r = uninstall(tmp_path, "compute")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["systemd"][:2] == [
        "systemctl disable --now hpresilience-agent.service",
        "systemctl disable --now hpresilience-shm-hugepages.service",
    ]
    now = files_under(tmp_path)
    assert "etc/systemd/system/hpresilience-agent.service" not in now
    assert "etc/systemd/system/hpresilience-shm-hugepages.service" not in now
    assert "opt/hpresilience/slurm/healthcheck.sh" not in now
    assert {"opt/hpresilience/bin/srun", "etc/hpresilience/config.yaml", "etc/profile.d/hpresilience.sh"} <= now
    assert json.loads(layout.manifest.read_text())["roles"] == ["login"]
    r = uninstall(tmp_path, "login")
    assert r.returncode == 0, r.stderr
    assert files_under(tmp_path) - before == set()
    assert str(tmp_path / "var/lib/hpresilience") in json.loads(r.stdout)["left"]


def test_an_edited_config_is_kept_and_a_role_not_installed_is_refused(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    lay_out(layout, "controller", config=None, package_changed=False, use_systemd=False, slurm_conf=None)
    layout.config.write_text(layout.config.read_text() + "# our site: see the wiki\n")
    r = uninstall(tmp_path, "compute")
    assert r.returncode == 2 and "role compute is not installed" in r.stderr
    r = uninstall(tmp_path, "controller")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert any(k.startswith(str(layout.config)) and "changed since install" in k for k in out["kept"])
    assert layout.config.exists() and not layout.unit_dir.joinpath("hpresilience-controller.service").exists()
    assert not layout.manifest.exists()
