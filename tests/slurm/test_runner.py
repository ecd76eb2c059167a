"""The command runner: timeouts kill the whole process group, errors carry command, code and stderr."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from hpresilience.errors import EnvironmentMissing, SlurmError, SlurmTimeout
from hpresilience.slurm.runner import CommandRunner, run_once


def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    """A command that forks a helper and hangs: both are gone when SlurmTimeout is raised."""
    pidfile = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pidfile}; wait"
    started = time.monotonic()
    with pytest.raises(SlurmTimeout) as exc:
        run_once(["sh", "-c", script], timeout=2.0)  # room to start the child on a loaded machine
    assert time.monotonic() - started < 5
    assert "timed out after 2 s" in str(exc.value)
    child = int(pidfile.read_text())

    def gone() -> bool:
        try:
            return psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    # SIGKILL is delivered at once, but a loaded kernel may take a moment to tear the process down.
    deadline = time.monotonic() + 5
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone()


def test_failure_carries_command_exit_code_and_stderr(tmp_path: Path) -> None:
    r = CommandRunner(bin_dir="/bin", retries=0)
    with pytest.raises(SlurmError) as exc:
        r.run("sh", "-c", "echo 'scontrol: error: Invalid node name specified' >&2; exit 1")
    err = exc.value
    assert err.returncode == 1 and "Invalid node name" in err.stderr and err.argv[0] == "/bin/sh"
    assert "exited 1" in str(err)


def test_transient_refusal_is_retried_then_succeeds(tmp_path: Path) -> None:
    """'try again in a bit' (slurmctld busy) is retried; a later success is returned."""
    counter = tmp_path / "n"
    counter.write_text("0")
    script = (
        f"n=$(cat {counter}); echo $((n+1)) > {counter}; "
        f'if [ "$n" -lt 2 ]; then echo "Job update not available right now, try again in a bit" >&2; exit 1; fi; '
        "echo done"
    )
    r = CommandRunner(bin_dir="/bin", retries=4, backoff=0.01)
    res = r.run("sh", "-c", script)
    assert res.stdout.strip() == "done" and counter.read_text().strip() == "3"


def test_permanent_error_is_not_retried(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    counter.write_text("")
    r = CommandRunner(bin_dir="/bin", retries=4, backoff=0.01)
    with pytest.raises(SlurmError):
        r.run("sh", "-c", f"echo x >> {counter}; echo 'Invalid job id specified' >&2; exit 1")
    assert counter.read_text().count("x") == 1


def test_missing_command_names_the_apt_package(tmp_path: Path) -> None:
    r = CommandRunner(bin_dir=str(tmp_path))
    with pytest.raises(EnvironmentMissing, match="apt-get install -y slurm-wlm"):
        r.run("scontrol", "show", "config")


def test_env_is_passed_to_the_command() -> None:
    r = CommandRunner(bin_dir="/bin", env={**os.environ, "SLURM_CONF": "/x/slurm.conf"})
    assert r.run("sh", "-c", "echo $SLURM_CONF").stdout.strip() == "/x/slurm.conf"


def test_a_variable_unset_for_one_command_is_not_in_its_environment_and_stays_in_the_runners() -> None:
    r = CommandRunner(bin_dir="/bin", env={**os.environ, "SLURM_JOBID": "7", "SLURM_CONF": "/x/slurm.conf"})
    said = r.run("sh", "-c", "echo ${SLURM_JOBID-unset} $SLURM_CONF", unset=("SLURM_JOBID",)).stdout.split()
    assert said == ["unset", "/x/slurm.conf"]
    assert r.run("sh", "-c", "echo $SLURM_JOBID").stdout.strip() == "7"
