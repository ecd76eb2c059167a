"""Issue 31, point 4 on the local cluster: real jobs whose working directories hold hostile ledgers (a FIFO;
escape sequences in a cause and `1e999` numbers), read through Slurm's own records by `hpresilience job`,
`hpresilience goodput` and the controller's goodput collector, as root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hpresilience.goodput.ledgermetrics import LedgerCollector
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster

pytestmark = pytest.mark.integration

ESC = "\x1b]2;owned\x07\x1b[2J"
T0 = 1_700_000_000


def hpr(cluster: DevCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as root would run it; 60 s is far beyond what it needs (the unfixed reader never returned)."""
    return subprocess.run(
        [sys.executable, "-m", "hpresilience", *args], env=cluster.env(), capture_output=True, text=True, timeout=60
    )


def submit(slurm: SlurmClient, work: Path) -> int:
    work.mkdir(parents=True)
    return slurm.sbatch("-N1", f"--chdir={work}", "-o", "/dev/null", "--wrap", "true")


def hostile_events() -> str:
    lines: list[dict[str, Any] | str] = [
        {"time": T0, "event": "attempt_started", "attempt": 1, "nodes": "n1"},
        '{"time": 1700000001, "event": "attempt_started", "attempt": 1e999, "nodes": "n2"}',
        {"time": T0 + 5, "event": "fault_seen", "cause": f"hardware{ESC}\nfake line", "nodes": f"n1{ESC}"},
        {"time": T0 + 6, "event": "attempt_started", "attempt": 2, "nodes": "n1"},
        {"time": T0 + 9, "event": "job_step_succeeded"},
    ]
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)


@pytest.fixture
def jobs(cluster: DevCluster, slurm: SlurmClient, tmp_path: Path) -> Iterator[tuple[int, int]]:
    fifo_job = submit(slurm, tmp_path / "fifo")
    d = tmp_path / "fifo" / ".hpresilience" / "jobs"
    d.mkdir(parents=True)
    os.mkfifo(d / f"{fifo_job}.events.jsonl")
    esc_job = submit(slurm, tmp_path / "esc")
    d = tmp_path / "esc" / ".hpresilience" / "jobs"
    d.mkdir(parents=True)
    (d / f"{esc_job}.events.jsonl").write_text(hostile_events())
    yield fifo_job, esc_job
    try:  # wake a reader the unfixed code left blocked on the FIFO
        os.close(
            os.open(
                tmp_path / "fifo" / ".hpresilience" / "jobs" / f"{fifo_job}.events.jsonl", os.O_WRONLY | os.O_NONBLOCK
            )
        )
    except OSError:
        pass


def test_hostile_ledgers_of_real_jobs_neither_hang_nor_reach_roots_terminal(
    cluster: DevCluster, slurm: SlurmClient, jobs: tuple[int, int]
) -> None:
    fifo_job, esc_job = jobs
    res = hpr(cluster, "job", str(fifo_job))
    assert res.returncode != 0 and "no ledger" in res.stderr + res.stdout
    res = hpr(cluster, "job", str(esc_job))
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout and "\\x1b]2;owned" in res.stdout
    assert not any(line.startswith("fake line") for line in res.stdout.splitlines())

    deadline = time.monotonic() + 90
    while True:  # slurmdbd lists the jobs a little after they end
        res = hpr(cluster, "goodput", "--since", "1h", "--json")
        assert res.returncode == 0, res.stderr
        listed = {j["job_id"] for j in json.loads(res.stdout)["jobs"]}
        if esc_job in listed or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert esc_job in listed and fifo_job not in listed
    text = hpr(cluster, "goodput", "--since", "1h").stdout
    assert "\x1b" not in text and "hardware\\x1b" in text

    registry = CollectorRegistry()
    registry.register(LedgerCollector(slurm, refresh_s=0, wait_s=60))
    body = generate_latest(registry).decode()
    assert f'job_id="{esc_job}"' in body and f'job_id="{fifo_job}"' not in body
