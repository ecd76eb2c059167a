"""`hpresilience epilog` and the Epilog that `install --role compute` lays out (issue 22, item 6): the
memory tier a crashed job left on a node is removed; nothing else is, and the epilog never fails."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from hpresilience.cli import main
from hpresilience.install.installer import lay_out
from hpresilience.install.layout import Layout


def _epilog(capsys: pytest.CaptureFixture[str], root: Path, job: str, uid: int | None = None) -> dict[str, Any]:
    rc = main(["--json", "epilog", "--memory-root", str(root), "--job-id", job, "--uid", str(uid or os.geteuid())])
    assert rc == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _ns(root: Path, name: str, job: str | None) -> Path:
    root.mkdir(mode=0o700, exist_ok=True)
    d = root / name
    (d / "step_0000000001").mkdir(parents=True, mode=0o700)
    (d / "step_0000000001" / "rank_0.bin").write_bytes(b"x" * 4096)
    if job is not None:
        (d / ".job").write_text(job)
        os.chmod(d / ".job", 0o600)
    return d


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_crashed_jobs_memory_tier_is_removed_by_the_epilog(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpresilience.torch import CheckpointConfig, TieredCheckpointer
    from tests.torch._workers import state_for

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    root = tmp_path / "shm-{uid}"
    ck = TieredCheckpointer(CheckpointConfig(namespace="run", memory_dir=str(root), replicate=False))
    ck.save(state_for(1, 0), 1)
    ck.flush()
    tier = ck.tier.base
    assert (tier / ".job").read_text() == "4242"  # the job that writes a tier records itself there
    other = _ns(ck.tier.root, "other-job", "77")
    # The job "crashes": no close(). Then Slurm runs the epilog for job 4242.
    out = _epilog(capsys, root, "4242")
    assert [r["folder"] for r in out["removed"]] == [str(tier)]
    assert not tier.exists() and other.exists()


def test_the_epilog_touches_no_folder_without_the_jobs_marker_and_follows_no_link(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = tmp_path / "shm"
    keep = _ns(root, "untagged", None)
    victim = _ns(tmp_path, "elsewhere", "9")
    os.symlink(victim, root / "link")
    assert _epilog(capsys, root, "9")["removed"] == []
    assert keep.exists() and victim.exists()


def test_the_epilog_refuses_a_root_others_can_write_and_still_exits_0(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = tmp_path / "shm"
    d = _ns(root, "ns", "5")
    os.chmod(root, 0o777)
    assert _epilog(capsys, root, "5")["removed"] == []
    assert d.exists()
    assert main(["epilog", "--memory-root", str(root), "--job-id", "", "--uid", ""]) == 0  # outside Slurm


def test_install_role_compute_lays_out_the_epilog_and_its_slurm_conf_line(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "root")
    report = lay_out(layout, "compute", config=None, package_changed=False, use_systemd=False, slurm_conf=None)
    script = layout.epilog
    assert str(script) in report.written
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert f"{layout.venv}/bin/hpresilience epilog" in script.read_text()
    assert f"Epilog={script}" in report.slurm_lines
    login = Layout(tmp_path / "login")
    lay_out(login, "login", config=None, package_changed=False, use_systemd=False, slurm_conf=None)
    assert not login.epilog.exists()
