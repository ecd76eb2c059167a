"""Shared fixtures: one real Slurm devcluster for the whole session (integration tests)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.exact import MARK_PATTERN
from hpresilience.testing import slurmroot
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.slurmroot import SlurmRelease

FIXTURES = Path(__file__).parent / "fixtures"
# Away from the default devcluster port so a demo cluster can run beside the tests. Under pytest-xdist each worker
# (gw0, gw1, ...) takes its own block of WORKER_PORTS: its session cluster, its module clusters (at most +900 above
# the base) and their namespaces, job ids (FirstJobId is the base port x 1000) and databases never meet another's.
WORKER_PORTS = 1000


def worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


# Every rank the tests start (local worlds, jobs on the devclusters, the demos) shares this machine's few cores with
# dozens of others: one intra-op thread each, as torchrun sets for several ranks per host. Without it each rank's
# idle OpenMP worker spins after every op: a 4-rank, 120-step run took 8.3 s of CPU per rank, 3.3 s with it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

TEST_BASE_PORT = int(os.environ.get("HPRESILIENCE_TEST_BASE_PORT", "18817")) + WORKER_PORTS * worker_index()
# The Slurm release the session cluster runs: `pytest --slurm 24.11`, or HPRESILIENCE_TEST_SLURM.
SLURM_ENV = "HPRESILIENCE_TEST_SLURM"
# SlurmdTimeout of the test clusters: Slurm's 300 s would keep a killed node in service for minutes; this is three
# times MessageTimeout (10 s), the devcluster's default. A killed slurmd's port stays open (its slurmstepd holds the
# listening socket), so each ping round waits MessageTimeout on it, and slurmctld calls a node DOWN when its last
# recorded answer is SlurmdTimeout older than the previous round. Under CI's load 24.11 then set the healthy nodes
# DOWN with it: at 5 s ("Nodes n[1,3-4] not responding, setting DOWN", killing the batch script of the job there)
# and at 15 s ("srun: error: Node failure on n3", "... on n1" 20 s after a node of an in-process job was killed,
# tests/autoresume/test_inprocess_integration.py); docs/slurm-notes.md.
TEST_SLURMD_TIMEOUT = "30"
# A folder the xdist workers of one run share (set by the controller in pytest_configure).
SHARED_RESULTS_ENV = "HPR_TEST_SHARED_RESULTS"

T = TypeVar("T")


# name -> the result as JSON, in this process.
_SHARED: dict[str, str] = {}


def shared_result(name: str, compute: Callable[[], T]) -> T:
    """`compute()` (a deterministic result, JSON-able), computed once per run: the first worker to ask computes it
    under a lock while the others wait, and they all read what it wrote; without xdist, once in this process.
    Always returned as JSON reads it back (a dict's keys are text), a fresh copy each call."""
    if name not in _SHARED:
        _SHARED[name] = _shared_json(name, compute)
    return cast(T, json.loads(_SHARED[name]))


def _shared_json(name: str, compute: Callable[[], object]) -> str:
    root = os.environ.get(SHARED_RESULTS_ENV)
    if not root:
        return json.dumps(compute())
    folder = Path(root)
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when compute() raises
        if not path.exists():
            path.write_text(json.dumps(compute()))
        return path.read_text()


def node_read(cl: DevCluster, hosts: str) -> str:
    """How the client reads named nodes on the cluster's release: text before 23.02, JSON since."""
    return f"scontrol show node {hosts} -o" if cl.release is SlurmRelease.HOST else f"scontrol --json show node {hosts}"


def full_node_read(cl: DevCluster) -> str:
    """How the client reads every node: sinfo --json on 22.05, scontrol --json show node since 23.02."""
    return "sinfo --json" if cl.release is SlurmRelease.HOST else "scontrol --json show node"


def job_read(cl: DevCluster, job: int | str) -> str:
    return f"scontrol show job {job} -o" if cl.release is SlurmRelease.HOST else f"scontrol --json show job {job}"


def unmarked(commands: list[str]) -> list[str]:
    """Commands with each query's random record mark (slurm/exact.py) written as MARK."""
    return [MARK_PATTERN.sub("MARK", c) for c in commands]


def held_read(cl: DevCluster, job: int | str) -> str:
    """How the requeue release reads one job exactly (unmarked): framed squeue before 23.02, JSON since."""
    if cl.release is SlurmRelease.HOST:
        return f"squeue -h -j {job} -t PD -o MARK%A|%r|%k"
    return f"scontrol --json show job {job}"


def notice_read(cl: DevCluster, job: int | str) -> str:
    """How a job's AdminComment is read exactly (unmarked): framed squeue before 23.02, JSON since."""
    if cl.release is SlurmRelease.HOST:
        return f"squeue -h -t all -j {job} -O JobID:0MARK,admin_comment:0MARK"
    return f"scontrol --json show job {job}"


def slurm_installed() -> bool:
    return all(shutil.which(t) for t in ("slurmctld", "slurmd", "scontrol", "srun", "sinfo", "squeue"))


def require_slurm() -> None:
    if not slurm_installed():
        if os.environ.get("CI"):
            pytest.fail("Slurm is not installed (apt-get install -y slurm-wlm); CI must run integration tests")
        pytest.skip("Slurm is not installed (apt-get install -y slurm-wlm)")


def session_release(config: pytest.Config) -> SlurmRelease:
    """The release the session cluster runs. A newer one needs the session itself inside its root, where every
    test's sbatch, srun shim and controller find that release's commands."""
    release = SlurmRelease.parse(str(config.getoption("--slurm")))
    if release.suite is not None and not slurmroot.inside_root():
        pytest.fail(
            f"--slurm {release.value} runs inside its Debian root: hpresilience devcluster exec --slurm "
            f"{release.value} -- python -m pytest --slurm {release.value} ...",
            pytrace=False,
        )
    return release


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[DevCluster]:
    """A real 4-node cluster, shared by every integration test of the session."""
    release = session_release(pytestconfig)
    require_slurm()
    cl = DevCluster(
        state_dir=tmp_path_factory.mktemp("devcluster") / "cluster",
        nodes=4,
        base_port=TEST_BASE_PORT,
        overrides={"SlurmdTimeout": TEST_SLURMD_TIMEOUT},
        slurm=release,
    )
    cl.up(timeout=60)
    yield cl
    cl.down()


@pytest.fixture()
def cluster(devcluster: DevCluster) -> Iterator[DevCluster]:
    """The session cluster, reset to all-idle before the test: no jobs, every node resumed and running."""
    reset_cluster(devcluster)
    yield devcluster


@pytest.fixture()
def slurm(cluster: DevCluster) -> SlurmClient:
    return cluster.client()


def reset_cluster(cl: DevCluster) -> None:
    client = cl.client()
    for j in client.jobs():
        if not j.is_finished:
            client.cancel(j.job_id)
    pids = cl.daemon_pids()
    for name in cl.names():
        if name not in pids:
            cl.start_node(name)
    deadline = time.monotonic() + 30
    while True:
        nodes = client.nodes()
        alive = [j for j in client.jobs() if not j.is_finished]
        if all(n.is_idle for n in nodes) and not alive:
            return
        # A job that came after the cancels above: the last request of a wrapper its job's end killed (a grow's
        # helper job, pending on an expand dependency that can never be met now).
        for j in alive:
            if j.is_pending:
                with contextlib.suppress(HPResilienceError):
                    client.cancel(j.job_id)
        for n in nodes:
            if n.has("DRAIN", "FAIL", "DOWN") and not n.is_busy:
                try:
                    client.set_node_state([n.name], "resume")
                except HPResilienceError:  # may race with the node coming back by itself
                    pass
        if time.monotonic() > deadline:
            jobs = ", ".join(f"{j.job_id} {j.name} {j.state} ({j.state_reason})" for j in alive) or "none"
            states = ", ".join(f"{n.name}={n.state_text}" for n in nodes)
            raise RuntimeError(f"could not reset devcluster: {states}; jobs not finished: {jobs}")
        time.sleep(0.3)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="fuzz tests run 100,000 inputs per target (also: HPRESILIENCE_FUZZ_LONG=1)",
    )
    parser.addoption(
        "--slurm",
        choices=[r.value for r in SlurmRelease],
        default=os.environ.get(SLURM_ENV) or SlurmRelease.HOST.value,
        help=f"Slurm release of the session cluster (also: {SLURM_ENV}); 24.11 and 26.05 run inside "
        "their root: hpresilience devcluster exec --slurm V -- python -m pytest --slurm V",
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"slurm release of the session cluster: {config.getoption('--slurm')}"


OWN_BASETEMP = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    from tests import fuzz

    fuzz.set_long(bool(config.getoption("--long")))
    # Under pytest-xdist each worker's temporary paths gain `popen-gwN/`; slurmstepd's Unix sockets live in a
    # cluster's spool below them and Linux caps a socket path at 108 bytes (`/tmp/pytest-of-root/pytest-N/popen-gw0/
    # test_.../cluster/spool/n1/n1_<job>.<step>` is 113: the batch step never starts). A short base of our own
    # keeps every worker's paths shorter than a plain run's.
    controller = not os.environ.get("PYTEST_XDIST_WORKER")
    if controller and getattr(config.option, "numprocesses", None):
        if not config.option.basetemp:
            config.option.basetemp = tempfile.mkdtemp(prefix="hpr", dir="/tmp")
            config.stash[OWN_BASETEMP] = Path(config.option.basetemp)
        # The workers (started after this, with this environment) share deterministic results through it.
        os.environ[SHARED_RESULTS_ENV] = str(Path(config.option.basetemp).resolve() / "shared-results")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The short base made in pytest_configure goes after a passing run (600 MB of clusters' spools and logs each
    run, which every run left in /tmp before); a failing run's stays for its logs, and says where."""
    base = session.config.stash.get(OWN_BASETEMP, None)
    if base is None:
        return
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"\ntest directories kept in {base}", file=sys.stderr)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests import fuzz

    if not fuzz.TALLY:
        return
    terminalreporter.section("fuzz tally (inputs, clear errors, skips, crashes)")
    for target, c in sorted(fuzz.TALLY.items()):
        inputs = c["accepted"] + c["clear_error"]
        terminalreporter.write_line(
            f"{target:32s} inputs {inputs:7d}  accepted {c['accepted']:7d}  clear errors {c['clear_error']:7d}  "
            f"records skipped {c['skipped']:7d}  crashes {c['crash']}"
        )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, but with tests/install as one unit: its files install from one wheel into throwaway roots
    (session fixtures), and on one worker the wheel and the roots are built once, not once per worker (a pip resolve
    and a venv each, ~50 s of CPU under load). (xdist's loadgroup would need marks, and it renames the test ids
    through an attribute pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class InstallTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return "tests/install" if path.startswith("tests/install/") else path

    return InstallTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests import fuzz

    # xdist's loadfile (with --no-loadscope-reorder, as scripts/dev.sh runs it) hands out files in collection
    # order, two at first and then one at a time per free worker. The files that wait on a real cluster
    # (integration) or start several processes (slow), and the install tests (their fixtures build a wheel and
    # install venvs from it: minutes under CI's load), go first, the files with more such tests before the others:
    # the last files handed out are short ones, so no worker ends the run alone on a long one (the demos, handed
    # out last, kept one worker busy ~3 min after the others had ended).
    def long(item: pytest.Item) -> bool:
        marked = item.get_closest_marker("integration") or item.get_closest_marker("slow")
        return marked is not None or "wheel" in getattr(item, "fixturenames", ())

    per_file: dict[str, int] = {}
    for item in items:
        if long(item):
            per_file[item.nodeid.split("::")[0]] = per_file.get(item.nodeid.split("::")[0], 0) + 1
    items.sort(key=lambda item: (not long(item), -per_file.get(item.nodeid.split("::")[0], 0)))

    if fuzz.examples() > fuzz.SHORT_EXAMPLES:  # a long fuzz run outlasts the suite's per-test timeout by design
        for item in items:
            module = getattr(item, "module", None)
            if module is not None and module.__name__.endswith("_fuzz"):
                item.add_marker(pytest.mark.timeout(0))


def self_watch_config(directory: Path) -> str:
    """A config file for wrappers on a cluster where no controller tells jobs of bad nodes (tests that mark
    nodes by hand): the wrapper reads its step's nodes every half second itself, as it does without one."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "self-watch.yaml"
    path.write_text("autoresume:\n  full_node_check_s: 0.5\n")
    return str(path)
