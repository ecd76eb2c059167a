"""`hpresilience install` from a built wheel into throwaway roots, then what an operator and a user do next
on the real devcluster: srun --auto-resume=1 with a login PATH, `hpresilience status`, the units' ExecStart."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.install.conftest import LOGIN_PATH, Installed, hpr_install

pytestmark = pytest.mark.integration
TEXTFILE_DIR = Path("/var/lib/prometheus/node-exporter")
SHORT_STRESS = {"duration_s": 3, "cpu_workers": 1, "vm_workers": 1, "vm_bytes": "64M"}


def exec_start(unit: Path) -> list[str]:
    line = next(ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def test_compute_install_lays_out_every_file_from_the_wheel(compute_root: Installed) -> None:
    """Venv, CLI and shim on PATH, healthcheck.sh, agent unit, snippet, and a valid default config."""
    p = compute_root.prefix
    assert (p / "venv" / "bin" / "hpresilience").exists()
    assert os.access(p / "bin" / "srun", os.X_OK) and (p / "bin" / "hpresilience").resolve().exists()
    # The package in the venv is the wheel's, not this source tree's (the files come from inside the wheel).
    out = subprocess.run(
        [str(p / "venv" / "bin" / "python"), "-c", "import hpresilience; print(hpresilience.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=compute_root.root,
    ).stdout
    assert str(p / "venv") in out
    hc = (p / "slurm" / "healthcheck.sh").read_text()
    assert f"exec {p}/venv/bin/hpresilience --config {compute_root.config} agent --once" in hc
    snippet = (p / "slurm" / "slurm.conf.hpresilience").read_text()
    assert f"HealthCheckProgram={p}/slurm/healthcheck.sh" in snippet
    assert exec_start(compute_root.unit("hpresilience-agent.service"))[:3] == [
        f"{p}/venv/bin/hpresilience",
        "--config",
        str(compute_root.config),
    ]
    assert not compute_root.unit("hpresilience-controller.service").exists()
    # No --config given: the defaults are written, so the unit's --config names a file that exists.
    cfg = yaml.safe_load(compute_root.config.read_text())
    assert cfg["agent"]["state_dir"] == str(compute_root.root / "var/lib/hpresilience/agent")
    # The slurm.conf lines to merge are printed.
    assert "slurm.conf: merge these lines" in compute_root.outputs[0].stdout
    assert "SchedulerParameters=permit_job_expansion" in compute_root.outputs[0].stdout


def test_a_second_install_changes_nothing_and_reinstalls_nothing(compute_root: Installed, wheel: Path) -> None:
    """Idempotent: the same wheel again writes no file and runs no pip."""
    before = {p: p.stat().st_mtime_ns for p in compute_root.root.rglob("*") if p.is_file() and "venv" not in p.parts}
    res = hpr_install("--role", "compute", "--root", str(compute_root.root), "--wheel", str(wheel), "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["written"] == [] and len(report["unchanged"]) >= 6
    assert "package_unchanged" in res.stderr and "package_installed" not in res.stderr
    after = {p: p.stat().st_mtime_ns for p in before}
    assert {p for p in before if before[p] != after[p]} <= {compute_root.prefix / "install-manifest.json"}


def test_srun_auto_resume_works_for_a_user_with_the_login_path(
    compute_root: Installed, cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """`srun --auto-resume=1 hostname` in a batch job, PATH = login default + the install's profile.d entry."""
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/sh\n. {compute_root.root}/etc/profile.d/hpresilience.sh\n"
        "echo srun_is=$(command -v srun)\n"
        f"srun --auto-resume=1 --auto-resume-state-dir={tmp_path}/state hostname\necho rc=$?\n"
    )
    env = cluster.env()
    env["PATH"] = LOGIN_PATH
    job = slurm.sbatch("--nodes=1", f"--output={tmp_path}/out", f"--chdir={tmp_path}", str(script), env=env)
    deadline = time.monotonic() + 60
    out = tmp_path / "out"
    while "rc=" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline, f"job {job} did not finish: {out.read_text() if out.exists() else ''}"
        time.sleep(0.3)
    text = out.read_text()
    assert f"srun_is={compute_root.prefix}/bin/srun" in text
    assert "rc=0" in text, text
    assert os.uname().nodename.split(".")[0] in text
    prom = TEXTFILE_DIR / f"hpresilience_job_{job}.prom"
    if os.access(TEXTFILE_DIR, os.W_OK):
        # Its metrics land where node_exporter's textfile collector reads.
        text_prom = prom.read_text()
        prom.unlink()
        assert "hpr_autoresume_attempts" in text_prom
    # The wrapper ran (not the plain srun): its decisions are in the job's output and its state directory.
    assert '"job_step_succeeded"' in text
    assert (tmp_path / "state" / f"{job}.events.jsonl").exists()


def test_agent_unit_exec_start_runs_without_exiting(
    compute_root: Installed, cluster: DevCluster, tmp_path: Path
) -> None:
    """The unit's own ExecStart (plus --dry-run) starts, cycles against Slurm, and stops cleanly on SIGTERM."""
    argv = exec_start(compute_root.unit("hpresilience-agent.service"))
    env = {**cluster.env(), "SLURMD_NODENAME": "n1"}
    log = tmp_path / "agent.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [*argv, "--dry-run", "--metrics-address", "", "--interval", "1"],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while '"agent_started"' not in log.read_text():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
            time.sleep(3)
            assert proc.poll() is None, log.read_text()
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
    assert rc == 0, log.read_text()
    assert "agent_cycle_failed" not in log.read_text()


def test_healthcheck_program_runs_one_cycle_and_records_active_checks(
    compute_root: Installed, cluster: DevCluster
) -> None:
    """healthcheck.sh, as Slurm's HealthCheckProgram runs it, gives a verdict for the node and leaves in the
    agent's state file when active checks last ran (so the next run does not stress the node again). The active
    checks ran with the node held out of scheduling, and it is back in service afterwards."""
    saved = compute_root.config.read_text()
    cfg = yaml.safe_load(saved)
    # This host's real checks must not mark a devcluster node: enforce (observe runs no active check), with a
    # fleet ceiling of 0 nodes, so any mark is held.
    cfg["agent"].update({"mode": "enforce", "max_out_min": 0, "max_out_fraction": 0.01})
    # The stress check as shipped, shorter and on one core: its default (30 s on every core) took a minute of
    # CPU from the rest of the suite on CI's 2 cores.
    cfg.setdefault("health", {}).setdefault("checks", {})["system.stress"] = SHORT_STRESS
    compute_root.config.write_text(yaml.safe_dump(cfg))
    try:
        res = subprocess.run(
            ["sh", str(compute_root.prefix / "slurm" / "healthcheck.sh")],
            env={**cluster.env(), "SLURMD_NODENAME": "n2", "PATH": LOGIN_PATH},
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        compute_root.config.write_text(saved)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("n2: none (healthy)"), res.stdout + res.stderr[-2000:]
    assert "node_held_for_active_checks" in res.stderr and "node_released_after_active_checks" in res.stderr
    state = json.loads((compute_root.root / "var/lib/hpresilience/agent/agent-n2.json").read_text())
    assert time.time() - state["last_active_at"] < 300 and state["holding"] is False
    n2 = cluster.client().node("n2")
    assert not n2.has("DRAIN") and not n2.reason


def test_head_node_status_and_controller_exec_start(head_root: Installed, cluster: DevCluster) -> None:
    """login + controller on one root: the CLI on PATH, `status` works once the controller ran its ExecStart."""
    p = head_root.prefix
    assert os.access(p / "bin" / "srun", os.X_OK)  # the login role put the shim there
    assert "package_unchanged" in head_root.outputs[1].stderr  # the second role reused the venv
    hpr = str(p / "bin" / "hpresilience")
    before = subprocess.run([hpr, "--config", str(head_root.config), "status"], capture_output=True, text=True)
    assert before.returncode == 1 and "no controller state" in before.stderr
    argv = exec_start(head_root.unit("hpresilience-controller.service"))
    # The default provider is `reboot` and the devcluster's slurmctld has no RebootProgram: refused at start.
    ran = subprocess.run([*argv, "--once"], env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2 and "needs RebootProgram" in ran.stderr, ran.stderr
    saved = head_root.config.read_text()
    cfg = yaml.safe_load(saved)
    cfg["controller"].update(default_provider="script", default_options={"command": ["/bin/true"]})
    head_root.config.write_text(yaml.safe_dump(cfg))
    try:
        ran = subprocess.run([*argv, "--once"], env=cluster.env(), capture_output=True, text=True, timeout=120)
    finally:
        head_root.config.write_text(saved)
    assert ran.returncode == 0, ran.stderr
    res = subprocess.run(
        [
            "sh",
            "-c",
            f". {head_root.root}/etc/profile.d/hpresilience.sh; hpresilience --config {head_root.config} status",
        ],
        env={"PATH": LOGIN_PATH, "HOME": "/root"},
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert "(no node under repair)" in res.stdout


def test_a_bad_config_is_refused_before_anything_lands(tmp_path: Path, wheel: Path) -> None:
    """Exit 2 naming the file and key; no venv, no /etc file, nothing under the root."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent:\n  pasive_interval_s: 5\n")
    root = tmp_path / "root"
    res = hpr_install("--role", "compute", "--root", str(root), "--wheel", str(wheel), "--config", str(bad))
    assert res.returncode == 2
    assert f"{bad}: agent.pasive_interval_s: unknown key" in res.stderr
    assert not root.exists() or not any(root.rglob("*"))


def test_a_bad_config_in_place_fails_the_install(compute_root: Installed, wheel: Path, tmp_path: Path) -> None:
    """A broken /etc/hpresilience/config.yaml would make the units fail: the install says so, exit 2."""
    saved = compute_root.config.read_text()
    compute_root.config.write_text("agent: [1, 2]\n")
    try:
        res = hpr_install("--role", "compute", "--root", str(compute_root.root), "--wheel", str(wheel))
    finally:
        compute_root.config.write_text(saved)
    assert res.returncode == 2 and str(compute_root.config) in res.stderr
