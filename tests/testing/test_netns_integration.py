"""Nodes as separate hosts (`devcluster up --isolation netns`): one module cluster of 3 nodes, each in its own
network and PID namespace, with Slurm's default SlurmdTimeout (300 s) and proctrack/pgid (so that tasks can escape
their step, as torchrun's workers do, and only our reap can find them)."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import psutil
import pytest
import yaml

from hpresilience import proc
from hpresilience.controller.loop import Controller
from hpresilience.testing import netns, netshape, nodecpu
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.netns import Isolation
from tests.autoresume.test_wrapper_integration import TRAINER, Run, processes_with, unique_token
from tests.conftest import TEST_BASE_PORT, require_slurm
from tests.controller.conftest import history, settings_for, start_controller, write_scripts  # noqa: F401

pytestmark = pytest.mark.integration
PORT = TEST_BASE_PORT + 700  # away from the session cluster and the fault-sequence module's (+600)


def need_netns() -> None:
    if os.geteuid() != 0:
        pytest.skip("--isolation netns needs root")
    if not all(proc.run(["sh", "-c", f"command -v {t}"], 5).ok for t in ("ip", "nsenter", "unshare")):
        pytest.fail("ip/nsenter/unshare missing: apt-get install -y iproute2 util-linux")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    need_netns()
    cl = DevCluster(
        state_dir=tmp_path_factory.mktemp("netns") / "cluster",
        nodes=3,
        base_port=PORT,
        overrides={"SlurmdTimeout": "300"},
        proctrack="pgid",
        isolation=Isolation.NETNS,
    )
    cl.up(timeout=60)
    yield cl
    cl.down()


def on_node(cl: DevCluster, node: str, script: str, timeout: float = 15.0) -> proc.Result:
    """One task on `node` (a job step of its own), run from the controller's namespace."""
    return proc.run([*cl.command_prefix(), "srun", "-N1", "-w", node, "sh", "-c", script], timeout, env=cl.env())


def node_of(p: psutil.Process) -> str | None:
    with contextlib.suppress(psutil.Error):
        return p.environ().get("SLURMD_NODENAME")
    return None


def test_each_node_has_its_own_address_and_sees_only_its_own_processes(hosts: DevCluster) -> None:
    res = proc.run(
        [
            *hosts.command_prefix(),
            "srun",
            "-N3",
            "sh",
            "-c",
            'echo "$SLURMD_NODENAME $(ls /proc | grep -c "^[0-9]") $(cat /proc/net/fib_trie | '
            'grep -o "10\\.77\\.0\\.1[0-9]" | sort -u | tr "\\n" " ")"',
        ],
        30,
        env=hosts.env(),
    )
    assert res.ok, res.describe(tail=500)
    seen = {line.split()[0]: line.split()[1:] for line in res.stdout.splitlines() if line.strip()}
    assert sorted(seen) == ["n1", "n2", "n3"]
    for i, name in enumerate(["n1", "n2", "n3"], start=1):
        count, *addrs = seen[name]
        assert int(count) < 20, f"{name} sees {count} processes: not a PID namespace of its own"
        assert addrs == [netns.node_addr(i)], f"{name} has addresses {addrs}"
    # Nothing of the cluster's network is on the host: no 10.77.0.x address, no link of ours.
    host = proc.run(["ip", "-o", "addr"], 5).stdout
    assert netns.SUBNET not in host and "vn1" not in proc.run(["ip", "-o", "link"], 5).stdout


def test_a_partitioned_node_is_unreachable_while_its_processes_run_and_heal_restores_it(hosts: DevCluster) -> None:
    token = unique_token()
    started = on_node(
        hosts, "n2", f"setsid bash -c 'while sleep 0.3; do :; done' {token} </dev/null >/dev/null 2>&1 & sleep 1"
    )
    assert started.ok, started.describe(tail=300)
    try:
        [task] = processes_with(token)
        hosts.partition("n2")
        assert netns.is_partitioned(PORT, "n2")
        assert tcp_connect_s(hosts, "n2", tries=1) is None  # n2's slurmd cannot be reached
        assert tcp_connect_s(hosts, "n3", tries=1) is not None  # the other nodes can
        assert task.is_running() and task.status() != psutil.STATUS_ZOMBIE
        hosts.heal("n2")
        assert not netns.is_partitioned(PORT, "n2")
        back = on_node(hosts, "n2", "echo reached", timeout=20)
        assert back.ok and "reached" in back.stdout, back.describe(tail=300)
        assert task.is_running()
    finally:
        hosts.heal("n2")
        for p in processes_with(token):
            with contextlib.suppress(psutil.Error):
                p.kill()


def hpr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpresilience", *args], capture_output=True, text=True, timeout=60)


def test_the_cli_partitions_and_heals_a_node_of_the_cluster_in_its_state_directory(
    hosts: DevCluster, tmp_path: Path
) -> None:
    where = ("--state-dir", str(hosts.state_dir))
    cut = hpr("devcluster", "partition", "n3", *where)
    try:
        assert cut.returncode == 0 and "partitioned n3" in cut.stdout, cut.stderr
        assert netns.is_partitioned(PORT, "n3")  # the port and node count came from the cluster's slurm.conf
    finally:
        healed = hpr("devcluster", "heal", "n3", *where)
    assert healed.returncode == 0 and not netns.is_partitioned(PORT, "n3"), healed.stderr
    unknown = hpr("devcluster", "slow", "n9", "--delay-ms", "10", *where)
    assert unknown.returncode != 0 and "unknown node 'n9'" in unknown.stderr
    # A cluster without isolation (here: none at all in this directory) says what to do instead.
    plain = hpr("devcluster", "partition", "n1", "--state-dir", str(tmp_path / "none"))
    assert plain.returncode != 0 and "--isolation netns" in plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1, plain.stderr


def test_env_refuses_a_netns_cluster_and_a_host_client_with_its_conf_sends_nothing_out(hosts: DevCluster) -> None:
    """The cluster's addresses exist only in its namespaces: from the host they would leave by the default route."""
    env = hpr("devcluster", "env", "--state-dir", str(hosts.state_dir))
    assert env.returncode != 0 and "SLURM_CONF" not in env.stdout, env.stdout
    assert "devcluster exec" in env.stderr and len(env.stderr.strip().splitlines()) == 1, env.stderr
    # Even with the conf named by hand, the host routes the cluster's subnet nowhere while the cluster is up.
    assert netns.guarded()
    assert " via " not in f" {netns.host_route()} ", netns.host_route()
    res = proc.run(["sinfo", "-h"], 20, env={**os.environ, "SLURM_CONF": str(hosts.conf_path)})
    assert not res.ok and "connect failure" in res.stderr, res.describe()  # EHOSTUNREACH: nothing was sent
    # ... and the way `env` names reaches the cluster.
    inside = hpr("devcluster", "exec", "--state-dir", str(hosts.state_dir), "--", "sinfo", "-h", "-N", "-o", "%N")
    assert inside.returncode == 0 and "n1" in inside.stdout, inside.stderr


def tcp_connect_s(cl: DevCluster, node: str, tries: int = 5) -> float | None:
    """Median time of a TCP connect from the controller's namespace to the node's slurmd (one round trip);
    None when it does not connect within 2 s."""
    addr = netns.node_addr(cl.names().index(node) + 1)
    code = (
        f"import socket,time,statistics\nts=[]\nfor _ in range({tries}):\n t=time.monotonic()\n"
        f" s=socket.create_connection(('{addr}',{cl.node_port(node)}),timeout=2)\n"
        " ts.append(time.monotonic()-t)\n s.close()\nprint(statistics.median(ts))"
    )
    res = proc.run([*cl.command_prefix(), sys.executable, "-c", code], 30)
    return float(res.stdout.strip()) if res.ok else None


def test_slow_adds_the_delay_to_the_nodes_link_and_zero_removes_it(hosts: DevCluster) -> None:
    missing = netns.netem_usable()
    if missing:
        pytest.skip(f"this kernel has no netem qdisc (sch_netem): `tc qdisc add ... netem` says {missing!r}")
    before = tcp_connect_s(hosts, "n3")
    assert before is not None
    hosts.slow("n3", 100)
    try:
        slowed = tcp_connect_s(hosts, "n3")
        assert slowed is not None and slowed >= 0.19, f"connect took {slowed} s with 100 ms each way"  # both ways
    finally:
        hosts.slow("n3", 0)
    after = tcp_connect_s(hosts, "n3")
    assert after is not None and after < before + 0.05


# A sink in the controller's namespace: reads BYTES from each connection, answers one byte (the transfer's end).
SINK = """
import socket, sys, threading
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
def serve(c):
    got = 0
    while got < int(sys.argv[3]):
        chunk = c.recv(65536)
        if not chunk:
            break
        got += len(chunk)
    c.sendall(b"k")
    c.close()
while True:
    threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
"""
# One task's transfer-bound steps: each sends BYTES to the sink and waits for its answer.
STEPS = """
import os, socket, sys, time
for _ in range(int(sys.argv[4])):
    t = time.monotonic()
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
    s.sendall(b"x" * int(sys.argv[3]))
    s.recv(1)
    s.close()
    print(os.environ["SLURMD_NODENAME"], round(time.monotonic() - t, 4), flush=True)
"""


def transfer_steps(cl: DevCluster, nodes: str, port: int, size: int, steps: int) -> dict[str, list[float]]:
    """node -> its step times: one task per node, each step a transfer of `size` bytes to the sink."""
    res = proc.run(
        [*cl.command_prefix(), "srun", f"-N{nodes.count(',') + 1}", "-w", nodes, sys.executable, "-c", STEPS,
         netns.CTL_ADDR, str(port), str(size), str(steps)],
        120,
        env=cl.env(),
    )  # fmt: skip
    assert res.ok, res.describe(tail=500)
    out: dict[str, list[float]] = {}
    for line in res.stdout.splitlines():
        node, took = line.split()
        out.setdefault(node, []).append(float(took))
    return out


def test_a_node_whose_link_is_capped_takes_longer_for_a_transfer_bound_step_and_rate_zero_lifts_the_cap(
    hosts: DevCluster,
) -> None:
    """n3's link at 1 mbit (tbf, built into the kernel, unlike netem): a step sending 96 kB takes at least the
    0.77 s the cap allows there, while n1's takes milliseconds; `--rate 0` gives n3 its speed back."""
    size, port = 96_000, PORT - 1  # a port of the controller's namespace, whose Slurm ports are PORT and above
    sink = subprocess.Popen(
        [*hosts.command_prefix(), sys.executable, "-c", SINK, netns.CTL_ADDR, str(port), str(size)],
        stdout=subprocess.PIPE,
        text=True,
    )
    where = ("--state-dir", str(hosts.state_dir))
    try:
        assert sink.stdout is not None and sink.stdout.readline().strip() == "listening"
        capped = hpr("devcluster", "slow", "n3", "--rate", "1mbit", *where)
        assert capped.returncode == 0 and "n3: link capped at 1mbit each way" in capped.stdout, capped.stderr
        assert all("tbf" in line and "rate 1Mbit" in line for line in netshape.shown(PORT, "n3"))
        times = transfer_steps(hosts, "n1,n3", port, size, 4)
        slow, fast = statistics.median(times["n3"]), statistics.median(times["n1"])
        print(f"96 kB step: n3 at 1mbit {slow:.3f} s, n1 {fast:.3f} s (x{slow / fast:.0f})")
        assert slow >= 0.7 and slow > 5 * fast, times
    finally:
        lifted = hpr("devcluster", "slow", "n3", "--rate", "0", *where)
        sink.kill()
        sink.wait(10)
    assert lifted.returncode == 0 and "link rate cap removed" in lifted.stdout, lifted.stderr
    assert netshape.shown(PORT, "n3") == ["", ""] or all("tbf" not in line for line in netshape.shown(PORT, "n3"))


def test_a_netns_nodes_slurmd_runs_in_its_own_cpu_cgroup_whose_quota_slow_cpu_sets(hosts: DevCluster) -> None:
    """Joined before its PID namespace is made: the quota reaches slurmd there and all it starts."""
    if nodecpu.hierarchy() is None:
        pytest.skip("no writable cpu cgroup controller here")
    slurmd = hosts.daemon_pids()["n2"]
    assert f"/{nodecpu.cgroup_name(PORT, 'n2')}" in Path(f"/proc/{slurmd}/cgroup").read_text()
    hosts.slow("n2", cpu=0.5)
    try:
        assert nodecpu.quota(PORT, "n2") == 0.5 and nodecpu.quota(PORT, "n1") is None
    finally:
        hosts.slow("n2", cpu=1)
    assert nodecpu.quota(PORT, "n2") is None


def test_a_delay_on_a_kernel_without_netem_is_refused_in_one_line_naming_the_module(hosts: DevCluster) -> None:
    if not netns.netem_usable():
        pytest.skip("this kernel has netem: the delay itself is tested above")
    res = hpr("devcluster", "slow", "n3", "--delay-ms", "10", "--state-dir", str(hosts.state_dir))
    assert res.returncode != 0 and "sch_netem" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_the_reap_runs_only_on_healthy_nodes_and_an_orphan_on_the_failed_node_outlives_the_job(
    hosts: DevCluster, tmp_path: Path
) -> None:
    """Under proctrack/pgid a task in a session of its own escapes its cancelled step. With separate process tables
    the reap (one task per healthy node) finds only its own node's orphan: the one on n2, the node set FAIL while
    its slurmd still answers, is out of the job's reach once n2 is released, and Slurm's kill (by process group)
    misses it. Real clusters use proctrack/cgroup, whose kill on release takes every process of the job."""
    slurm = hosts.client()
    token = unique_token()
    run = Run(
        hosts,
        slurm,
        tmp_path,
        "--auto-resume-spares=1",
        str(TRAINER),
        nodes=3,
        env={"TRAIN_STEPS": "30", "STEP_SLEEP": "0.2", "ORPHAN": token},
    )
    try:
        run.wait_output("step=3 ")
        first = run.named("attempt_started")[0]["nodes"].split(",")
        orphans = {node_of(p): p for p in processes_with(f"orphan-{token}")}
        assert sorted(n for n in orphans if n) == sorted(first)
        victim = next(n for n in first if n != slurm.job(run.job_id).batch_host)
        survivor = next(n for n in first if n != victim)
        slurm.set_node_state([victim], "fail", "Action:Replace")
        run.wait_output("training finished", timeout=60)
        # Attempt 2's own orphans hold the step's output open: srun would wait a minute for them.
        for p in processes_with(f"orphan-{token}"):
            with contextlib.suppress(psutil.Error):
                if p.environ().get("AUTORESUME_ATTEMPT") == "2":
                    p.kill()
        assert run.wait_done(60) == "0", run.err
        killed = [k for k in run.named("stale_task_killed") if f"orphan-{token}" in k["command"]]
        seen = [e for e in run.events() if e["event"] in ("fault_seen", "old_tasks_checked", "step_relaunching")]
        # the healthy node's own orphan, nobody else's
        assert [k["node"] for k in killed] == [survivor], (seen, run.err[-2000:])
        assert not orphans[survivor].is_running() or orphans[survivor].status() == psutil.STATUS_ZOMBIE
        assert orphans[victim].is_running(), "the failed node's orphan was killed: by whom?"
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
        for p in processes_with(token):
            with contextlib.suppress(psutil.Error):
                p.kill()
        with contextlib.suppress(Exception):
            slurm.set_node_state(["n1", "n2", "n3"], "resume")


def wait_for(probe: Callable[[], object], what: str, timeout: float) -> float:
    """Seconds until probe() is true (AssertionError naming `what` after timeout)."""
    started = time.monotonic()
    while not probe():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - started


def test_a_partitioned_training_node_is_replaced_by_the_spare_and_its_old_tasks_die_once_healed(
    hosts: DevCluster, tmp_path: Path
) -> None:
    """n2 loses its link under a 2-node step with a hot spare, with Slurm's default SlurmdTimeout (300 s): Slurm
    sees nothing for minutes. The wrapper notices n2's output stopped while n1's goes on, n2 runs no probe task,
    and the step goes again on n1 and the spare. Once n2 is healed, Slurm's own kill of the cancelled step
    reaches its slurmd and ends the old attempt's tasks there (the reap never runs on a node blamed bad)."""
    slurm = hosts.client()
    wait_for(lambda: all(n.is_idle for n in slurm.nodes(hosts.names())), "idle nodes", 60)
    token = unique_token()
    run = Run(
        hosts,
        slurm,
        tmp_path,
        "--auto-resume-spares=1",
        f"{TRAINER} {token}",
        nodes=3,
        env={"TRAIN_STEPS": "100000", "STEP_SLEEP": "0.2"},
    )
    victim = ""
    try:
        run.wait_output("step=3 ")
        first = run.named("attempt_started")[0]["nodes"].split(",")
        victim = next(n for n in first if n != slurm.job(run.job_id).batch_host)
        cut_at = time.time()
        hosts.partition(victim)
        wait_for(lambda: run.named("step_running"), "the relaunch", 60)
        took = run.named("step_running")[0]["time"] - cut_at
        print(
            f"partition of {victim} -> step running again on {run.named('attempt_started')[1]['nodes']} in {took:.1f} s"
        )
        assert took <= 30, took  # ~9 s here; the figure is in docs/slurm-notes.md, this bound is for slow CI
        assert victim not in run.named("attempt_started")[1]["nodes"].split(",")
        probed = run.named("silent_nodes_probed")[0]
        assert probed["unanswering"] == victim
        fault = run.named("fault_seen")[-1]
        assert fault["cause"] == "hardware" and fault["nodes"] == victim
        old = [p for p in processes_with(token) if node_of(p) == victim]
        assert old, "the old attempt's task on the partitioned node should still run while it is cut off"
        hosts.heal(victim)
        gone = wait_for(
            lambda: not [p for p in old if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
            "the old attempt's tasks on the healed node to end",
            90,
        )
        print(f"after heal, the old attempt's tasks on {victim} ended in {gone:.1f} s")
        assert not run.named("stale_task_killed")  # not our reap: Slurm's kill of the cancelled step
    finally:
        if victim:
            hosts.heal(victim)
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
        for p in processes_with(token):
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_two_controllers_on_two_hosts_one_acts_and_the_other_takes_over_when_it_dies(
    hosts: DevCluster, tmp_path: Path
) -> None:
    """Controllers on n1 and n3 (their own network namespaces) sharing one state directory, as two head nodes
    on a shared filesystem: the second is refused while the first holds the directory's lock (the controller's
    only guard: a lock file, no election), and once the first dies (SIGKILL, a crashed head node) the second
    starts and repairs a marked node, once."""
    slurm = hosts.client()
    wait_for(lambda: all(n.is_idle for n in slurm.nodes(hosts.names())), "idle nodes", 60)
    scripts = write_scripts(tmp_path / "scripts", hosts)
    state = tmp_path / "state"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"controller": settings_for(scripts, state).model_dump(mode="json")}))
    env = dict(hosts.env(), HPRESILIENCE_CONFIG=str(cfg))

    def controller_on(node: str, out: IO[str]) -> subprocess.Popen[str]:
        argv = [*netns.enter(netns.node_ns(PORT, node)), sys.executable, "-m", "hpresilience", "controller", "run"]
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)

    with open(tmp_path / "first.log", "w") as log1, open(tmp_path / "second.log", "w") as log2:
        first = controller_on("n1", log1)
        second: subprocess.Popen[str] | None = None
        try:
            wait_for(lambda: "controller_started" in (tmp_path / "first.log").read_text(), "the first controller", 30)
            refused = controller_on("n3", log2)
            assert refused.wait(30) != 0
            assert f"another controller (pid {first.pid})" in (tmp_path / "second.log").read_text()
            first.kill()
            first.wait(10)
            second = controller_on("n3", log2)
            wait_for(
                lambda: (tmp_path / "second.log").read_text().count("controller_started") == 1,
                "the second controller",
                30,
            )
            slurm.set_node_state(["n2"], "fail", "Action:Replace")
            wait_for(lambda: history(state), "the repair by the second controller", 60)
            assert scripts.calls == ["n2 replace"]
        finally:
            for p in (first, second):
                if p is not None and p.poll() is None:
                    p.terminate()
                    p.wait(30)
    wait_for(lambda: slurm.node("n2").is_idle, "n2 back", 30)


def test_a_backup_slurmctld_takes_over_while_a_step_runs_and_the_wrapper_and_controller_ride_through(
    tmp_path: Path, start_controller: Callable[[Controller], Controller]
) -> None:
    """Two controller hosts (SlurmctldHost ctl1, then ctl2, SlurmctldTimeout=5): the primary is killed (a crashed
    head node) while a 2-node step trains; the backup takes over, the step is never relaunched and finishes, and
    the hpresilience controller, running all along, repairs a node marked afterwards through the backup."""
    require_slurm()
    need_netns()
    cl = DevCluster(
        state_dir=tmp_path / "failover",
        nodes=2,
        base_port=PORT + 100,
        accounting=False,
        isolation=Isolation.NETNS,
        backup_controller=True,
        overrides={"SlurmctldTimeout": "5"},
    )
    cl.up(timeout=60)
    try:
        slurm = cl.client()
        scripts = write_scripts(tmp_path / "scripts", cl)
        start_controller(Controller(settings_for(scripts, tmp_path / "ctl"), slurm))
        (tmp_path / "job").mkdir()
        run = Run(
            cl, slurm, tmp_path / "job", "", str(TRAINER), nodes=2, env={"TRAIN_STEPS": "80", "STEP_SLEEP": "0.2"}
        )
        # slurmctld writes its state at most every few seconds: the backup must find the running job in it (a job
        # it does not know would be requeued by the takeover). Real jobs run far longer before a failover.
        run.wait_output("step=40 ", timeout=60)
        assert cl.kill_primary_controller() is not None
        assert run.wait_done(90) == "0", run.err
        assert len(run.named("attempt_started")) == 1 and run.named("job_step_succeeded")
        assert "rank=1 training finished step=80" in run.out
        ping = proc.run([*cl.command_prefix(), "scontrol", "ping"], 20, env=cl.env()).stdout
        assert "primary) at ctl1 is DOWN" in ping and "backup) at ctl2 is UP" in ping, ping
        assert "taking over" in (cl.log_dir / "slurmctld-backup.log").read_text()
        slurm.set_node_state(["n2"], "fail", "Action:Replace")
        wait_for(lambda: history(tmp_path / "ctl"), "the controller's repair through the backup", 60)
        assert scripts.calls == ["n2 replace"]
    finally:
        cl.down(remove=False)  # its logs stay in the test's directory


def test_down_removes_the_namespaces_of_a_cluster_whose_processes_all_died(tmp_path: Path) -> None:
    require_slurm()
    need_netns()
    port = PORT + 50
    cl = DevCluster(
        state_dir=tmp_path / "crashed", nodes=2, base_port=port, accounting=False, isolation=Isolation.NETNS
    )
    cl.up(timeout=30)
    try:
        for p in cl.processes():
            with contextlib.suppress(psutil.Error):
                p.kill()
        assert len(netns.existing(port)) == 3  # ctl, n1, n2: left behind by the "crash"
    finally:
        # A fresh object on the same port, without the state directory (a reboot of the test runner's view).
        DevCluster(state_dir=tmp_path / "elsewhere", nodes=2, base_port=port).down()
    assert netns.existing(port) == []
    if not netns.clusters_left():
        assert not netns.guarded()  # the last cluster gone takes the host's guard route with it
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
