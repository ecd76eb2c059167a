"""Which process a later CLI command on a netns cluster in a Slurm root joins (its mount namespace and root, as
root): only the cluster's own slurmctld, owned by root; a marker in an environment proves nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hpresilience.commands.devcluster import root_session
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.devprocs import MARKER
from hpresilience.testing.netns import Isolation


@pytest.fixture()
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait(10)


def test_only_a_root_owned_slurmctld_with_the_clusters_marker_is_joined(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (a process of another user)")
    state = tmp_path / "cluster"
    state.mkdir()
    cl = DevCluster(state, nodes=1, base_port=24000, accounting=False, isolation=Isolation.NETNS)
    fake = tmp_path / "slurmctld"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    fake.chmod(0o755)
    env = {**os.environ, MARKER: str(state)}

    def pid_of(argv: list[str]) -> int:
        p = subprocess.Popen([*argv, "60"], env=env)
        started.append(p)
        deadline = time.monotonic() + 10
        while psutil.Process(p.pid).name() not in ("sleep", "slurmctld"):  # setpriv has not executed it yet
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (state / "slurmctld.pid").write_text(f"{p.pid}\n")
        return p.pid

    assert root_session(cl) is None  # no pid file yet
    pid_of([shutil.which("sleep") or "/bin/sleep"])
    assert root_session(cl) is None  # the marker, but not a slurmctld
    pid_of(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(fake)])
    assert root_session(cl) is None  # named slurmctld with the marker, but a user's
    mine = pid_of([str(fake)])
    assert root_session(cl) == mine
    plain = DevCluster(tmp_path / "plain", nodes=1, base_port=24000, accounting=False)
    assert root_session(plain) is None  # no namespaces to find: a fresh rootexec.py serves
