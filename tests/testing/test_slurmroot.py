"""Slurm releases of the devcluster: the roots' binds, the release choice, and `devcluster exec`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hpresilience.errors import ConfigError, EnvironmentMissing
from hpresilience.testing import rootexec, slurmroot
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.slurmroot import SlurmRelease
from tests.conftest import TEST_BASE_PORT


def test_release_names_its_suite_and_an_unknown_one_lists_the_known() -> None:
    assert SlurmRelease.parse("24.11").suite == "trixie" and SlurmRelease.parse("26.05").suite == "sid"
    assert SlurmRelease.parse("22.05").suite is None  # the host's packages
    with pytest.raises(ConfigError, match=r"22\.05, 24\.11, 26\.05"):
        SlurmRelease.parse("23.02")


def test_binds_never_hide_the_roots_own_system(tmp_path: Path) -> None:
    """A bind over /, /usr or /etc would replace the root's Slurm or libraries with the host's."""
    binds = slurmroot.default_binds(["/", "/usr", "/etc", "/var/lib", str(tmp_path), "/work"])
    assert not any(
        slurmroot.is_system_path(b) and not b.startswith(("/usr/lib/python", "/usr/local/")) for b in binds
    ), binds
    assert "/tmp" in binds and str(tmp_path) not in binds  # under /tmp, which binds recursively
    assert sys.prefix in binds or any(sys.prefix.startswith(b + "/") for b in binds)


def test_host_release_runs_without_a_root() -> None:
    assert slurmroot.prefix(SlurmRelease.HOST) == []
    assert slurmroot.root_path(SlurmRelease.HOST) is None and slurmroot.is_ready(SlurmRelease.HOST)


def test_a_release_whose_root_is_missing_names_the_command_that_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPRESILIENCE_ROOTS_DIR", str(tmp_path / "roots"))
    monkeypatch.delenv(rootexec.INSIDE, raising=False)
    with pytest.raises(EnvironmentMissing, match=r"devcluster up --slurm 26\.05"):
        slurmroot.prefix(SlurmRelease.V26_05)


def test_a_command_joins_a_live_root_session_in_its_mount_namespace_and_root_marked_as_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A netns cluster in a root keeps its namespaces mounted in its `up`'s mount namespace: later commands join
    that one (its daemon's pid) instead of a fresh rootexec.py; the working directory stays where it is seen."""
    monkeypatch.setenv("HPRESILIENCE_ROOTS_DIR", str(tmp_path / "roots"))
    monkeypatch.delenv(rootexec.INSIDE, raising=False)
    me = os.getpid()
    assert slurmroot.session_prefix(SlurmRelease.V24_11, me, str(tmp_path)) == [
        "nsenter", f"--target={me}", "--mount", "--root", f"--wd={tmp_path}",
        "env", f"{rootexec.INSIDE}={tmp_path / 'roots' / 'trixie'}",
    ]  # fmt: skip
    assert "--wd=/" in slurmroot.session_prefix(SlurmRelease.V26_05, me, str(tmp_path / "nowhere"))
    assert slurmroot.session_prefix(SlurmRelease.HOST, me, "/") == []
    monkeypatch.setenv(rootexec.INSIDE, str(tmp_path / "roots" / "trixie"))
    assert slurmroot.session_prefix(SlurmRelease.V24_11, me, "/") == []  # inside already


def test_exec_sets_the_clusters_slurm_conf(tmp_path: Path) -> None:
    """`devcluster exec` on a cluster of the host's release: the command runs with its SLURM_CONF."""
    state = tmp_path / "cluster"
    state.mkdir()
    (state / "slurm.conf").write_text("# not started\n")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpresilience",
            "devcluster",
            "exec",
            "--state-dir",
            str(state),
            "--",
            sys.executable,
            "-c",
            "import os; print(os.environ['SLURM_CONF'])",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(state / "slurm.conf")


@pytest.mark.integration
def test_session_cluster_runs_the_selected_release(cluster: DevCluster, pytestconfig: pytest.Config) -> None:
    """`pytest --slurm 24.11` really runs 24.11's daemons and commands (22.05 by default)."""
    wanted = str(pytestconfig.getoption("--slurm"))
    major, minor, _ = cluster.client().version
    assert f"{major}.{minor:02d}" == wanted == cluster.release.value


@pytest.mark.integration
def test_exec_reaches_the_cluster_with_its_release(cluster: DevCluster) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpresilience",
            "devcluster",
            "exec",
            "--state-dir",
            str(cluster.state_dir),
            "--",
            "sinfo",
            "-h",
            "-N",
            "-o",
            "%N %T",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split()) == sorted([*cluster.names(), *(["idle"] * cluster.nodes)])
    version = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpresilience",
            "devcluster",
            "exec",
            "--state-dir",
            str(cluster.state_dir),
            "--",
            "sinfo",
            "-V",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert version.stdout.split()[-1].startswith(cluster.release.value)


def _names(procs: list[psutil.Process]) -> set[str]:
    """Names of the processes still alive: a step's short-lived helpers can exit between listing and reading."""
    names: set[str] = set()
    for p in procs:
        try:
            names.add(p.name())
        except psutil.NoSuchProcess:
            continue
    return names


@pytest.mark.integration
@pytest.mark.parametrize("release", [SlurmRelease.V24_11, SlurmRelease.V26_05])
def test_up_from_the_host_runs_a_newer_release_in_its_root_and_down_stops_it(
    release: SlurmRelease, tmp_path: Path
) -> None:
    """The CLI path a user takes: `devcluster up --slurm V` on the host re-runs itself in V's root, `exec` reaches
    it there, `down` (also re-run there) leaves no process. Needs the root built (scripts/dev.sh test builds it)."""
    if slurmroot.inside_root() or not slurmroot.is_ready(release):
        pytest.skip(
            f"the Slurm {release.value} root is not built here (hpresilience devcluster up --slurm "
            f"{release.value} builds it)"
        )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"devcluster: {{base_port: {TEST_BASE_PORT + 600}}}\n")
    state = tmp_path / "cluster"
    cli = [sys.executable, "-m", "hpresilience", "--config", str(cfg), "devcluster"]
    procs: list[psutil.Process] = []
    try:
        up = subprocess.run(
            [*cli, "up", "--slurm", release.value, "--no-accounting", "--state-dir", str(state)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert up.returncode == 0, up.stderr[-2000:]
        assert f"Slurm {release.value}, 4 nodes" in up.stdout
        version = subprocess.run(
            [*cli, "exec", "--state-dir", str(state), "--", "sinfo", "-V"], capture_output=True, text=True, timeout=60
        )
        assert version.stdout.split()[-1].startswith(release.value), version.stderr
        subprocess.run(
            [
                *cli,
                "exec",
                "--state-dir",
                str(state),
                "--",
                "sbatch",
                "-N2",
                "-o",
                "/dev/null",
                "--wrap",
                "srun sleep 300",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        # The daemons and the job's processes run in the root's own mount namespace; seen from the host they are
        # still this cluster's (slurmstepd by its working directory), so `down` can stop them all.
        deadline = time.monotonic() + 30
        while "sleep" not in _names(DevCluster(state).processes()):
            assert time.monotonic() < deadline, "the job's step never started"
            time.sleep(0.3)
        procs = DevCluster(state).processes()
        assert {"slurmctld", "slurmd", "slurmstepd", "sleep"} <= _names(procs)
    finally:
        down = subprocess.run([*cli, "down", "--state-dir", str(state)], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr[-2000:]
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.integration
def test_a_netns_cluster_of_a_newer_release_is_cut_healed_and_capped_by_separate_cli_commands_from_the_host(
    tmp_path: Path,
) -> None:
    """`up --isolation netns --slurm 24.11` on the host; each later command (a process of its own) reaches the
    namespaces that `up` mounted in the root's mount namespace, and `down` removes them. One release: 26.05 enters
    its root the same way (the netns tests run inside each release's root in scripts/dev.sh's release subsets)."""
    release = SlurmRelease.V24_11
    if slurmroot.inside_root() or not slurmroot.is_ready(release) or os.geteuid() != 0:
        pytest.skip(f"needs root and the Slurm {release.value} root built, run from the host")
    port = TEST_BASE_PORT + 650
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"devcluster: {{base_port: {port}}}\n")
    where = ("--state-dir", str(tmp_path / "cluster"))
    cli = [sys.executable, "-m", "hpresilience", "--config", str(cfg), "devcluster"]

    def hpr(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args, *where], capture_output=True, text=True, timeout=120)

    def inside(*argv: str) -> str:
        res = subprocess.run([*cli, "exec", *where, "--", *argv], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr[-1000:]
        return res.stdout

    try:
        up = hpr("up", "--isolation", "netns", "--slurm", release.value, "--nodes", "2", "--no-accounting")
        assert up.returncode == 0 and f"Slurm {release.value}, 2 nodes" in up.stdout, up.stderr[-2000:]
        assert inside("sinfo", "-V").split()[-1].startswith(release.value)
        assert hpr("partition", "n2").returncode == 0
        assert "state DOWN" in inside("ip", "-o", "-n", f"hpr{port}-ctl", "link", "show", "vn2")
        assert hpr("heal", "n2").returncode == 0
        assert "state UP" in inside("ip", "-o", "-n", f"hpr{port}-ctl", "link", "show", "vn2")
        capped = hpr("slow", "n2", "--rate", "1mbit")
        assert capped.returncode == 0, capped.stderr
        assert "rate 1Mbit" in inside("tc", "-n", f"hpr{port}-n2", "qdisc", "show", "dev", "eth0")
        # The node's own address, reached from its controller's namespace only.
        assert "idle" in inside("sinfo", "-h", "-n", "n2", "-o", "%T")
    finally:
        down = hpr("down")
    assert down.returncode == 0, down.stderr[-2000:]
    assert not [n for n in os.listdir("/run/netns") if n.startswith(f"hpr{port}-")]
