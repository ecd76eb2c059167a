"""The wrapper's step operations survive odd answers: a bad line costs that line, a refusal is a warning."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.runner import CommandRunner
from hpresilience.slurm.steps import job_steps, signal_step


def fake_bin(tmp_path: Path, tool: str, stdout: str, stderr: str = "", rc: int = 0) -> SlurmClient:
    """A client whose `tool` is a script printing a recorded answer (squeue cannot be made to print a broken
    hostlist, scancel's refusal needs another user's job)."""
    (tmp_path / "out.txt").write_text(stdout)
    (tmp_path / "err.txt").write_text(stderr)
    script = tmp_path / tool
    script.write_text(f"#!/bin/sh\ncat {tmp_path}/out.txt\ncat {tmp_path}/err.txt >&2\nexit {rc}\n")
    script.chmod(0o755)
    return SlurmClient(CommandRunner(str(tmp_path), timeout=5, retries=0))


def test_one_malformed_step_line_costs_only_its_nodes(tmp_path: Path) -> None:
    client = fake_bin(tmp_path, "squeue", "12.0|train|n[1-2]\n12.1|probe|n[3-\nbroken line\n12.2|x|n4\n")
    steps = job_steps(client, 12)
    assert [(s.step_id, s.nodes) for s in steps] == [("12.0", ("n1", "n2")), ("12.1", ()), ("12.2", ("n4",))]


def test_a_refused_scancel_is_a_warning_not_a_signalled_step(tmp_path: Path) -> None:
    client = fake_bin(
        tmp_path, "scancel", "", "scancel: error: Kill job error on job id 12.0: Access/permission denied", rc=1
    )
    with capture_logs() as logs:
        signal_step(client, "12.0", "USR1")
    events = [e["event"] for e in logs]
    assert "step_signal_refused" in events and "step_signalled" not in events
    assert next(e for e in logs if e["event"] == "step_signal_refused")["log_level"] == "warning"
