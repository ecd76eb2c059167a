"""What each part of hpresilience asks of Slurm on a production-size table (10,000 extra nodes).

Starts a devcluster with N powered-down p5 nodes beside the 4 real ones and measures, each in a fresh
Python process so that peaks are its own:
- full table: `SlurmClient.nodes()` (what the agent, the wrapper and the controller read every cycle before);
- agent, healthy cycle (the steady state) and the reads of its other paths: its own node (active check due,
  a finding to judge, a mark to lift) and the fleet ceiling's view (only when a mark is about to be made);
- wrapper poll of a 2-node and of a 64-node step (the step's nodes), and its per-attempt job read;
- controller cycle with 50 nodes asking for a repair (dry run: the same reads, no writes).
For each: Slurm commands run, bytes read, client wall time, client CPU and peak RSS including child
processes, and slurmctld CPU (from /proc/<pid>/stat before and after, its idle rate in the same run
subtracted), each also as a ratio against the full-table read of the same run. Then the projected
slurmctld load of 10,000 agents at their default interval and of 200 concurrent auto-resume jobs.

Targets (issue 12): healthy agent cycle 0 commands; wrapper poll <= 16 KB and <= 50 ms client CPU;
controller cycle with 50 nodes to repair <= 0.3 s client CPU.

    .venv/bin/python bench/bench_scale.py [--extra-nodes 10000] [--base-port 24217] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
REPAIRS = 50


def ctld_cpu(pid: int) -> float:
    """slurmctld's user+system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


# -- one scenario, in its own process -----------------------------------------------------------------
def scenario(name: str, conf: str, ctld: int, repeat: int, work: str) -> dict[str, Any]:
    from hpresilience.log import setup_logging
    from hpresilience.slurm.client import SlurmClient
    from hpresilience.slurm.runner import CommandRunner, CountingRunner

    setup_logging("error", json=True)
    runner = CountingRunner.like(CommandRunner(timeout=60, env={**os.environ, "SLURM_CONF": conf}))
    client = SlurmClient(runner)
    assert client.version
    op = prepare(name, client, work)
    op()  # warm: imports, caches
    runner.calls.clear()
    t0, c0, s0 = time.perf_counter(), os.times(), ctld_cpu(ctld)
    for _ in range(repeat):
        op()
    wall, c1, s1 = time.perf_counter() - t0, os.times(), ctld_cpu(ctld)
    cpu = (c1.user + c1.system + c1.children_user + c1.children_system
           - c0.user - c0.system - c0.children_user - c0.children_system)
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
           + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    return {"commands": len(runner.calls) / repeat, "bytes": runner.bytes_read / repeat, "wall": wall / repeat,
            "cpu": cpu / repeat, "rss_mb": rss, "ctld": (s1 - s0) / repeat, "elapsed": wall,
            "argv": sorted(set(runner.commands()))[:4]}


def prepare(name: str, client: Any, work: str) -> Any:
    if name == "full":
        return client.nodes
    if name.startswith("agent"):
        from hpresilience.agent.collector import HealthCollector
        from hpresilience.agent.daemon import Agent
        from hpresilience.agent.settings import AgentSettings
        from hpresilience.config import load_config
        from hpresilience.testing.fakenode import FakeNode

        node = FakeNode.make(Path(work) / f"fake-{name}", "p5.48xlarge")
        collector = HealthCollector(load_config(node.root / "config.yaml").health, sources=[])
        agent = Agent(AgentSettings(node_name="n1", state_dir=str(Path(work) / name), metrics_address="",
                                    active_checks=False), client, collector)
        agent.cycle()  # learns that no mark of its own is out
        if name == "agent_cycle":
            return agent.cycle
        if name == "agent_own_node":
            return agent.own_node
        return lambda: agent.fleet_view(agent.own_node())
    if name == "wrapper_poll_2":
        return lambda: client.nodes(["n1", "n2"])
    if name == "wrapper_poll_64":
        names = [f"gpu-st-p5-{i}" for i in range(1, 65)]
        return lambda: client.nodes(names)
    if name == "wrapper_job":
        job = int(Path(work, "job").read_text())
        return lambda: client.job(job)
    if name == "controller_cycle":
        from hpresilience.controller.loop import Controller
        from hpresilience.controller.settings import ControllerSettings

        ctl = Controller(ControllerSettings.model_validate(
            {"state_dir": str(Path(work) / "ctl"), "dry_run": True, "metrics_address": "",
             "max_concurrent": REPAIRS}), client)
        ctl.cycle()
        assert len(ctl.records) == REPAIRS, len(ctl.records)
        return ctl.cycle
    raise SystemExit(f"unknown scenario {name}")


# -- the driver ---------------------------------------------------------------------------------------
ROWS = [("full", "full table: SlurmClient.nodes() (before)", 3),
        ("agent_cycle", "agent: healthy cycle", 0),
        ("agent_own_node", "agent: own node (active check due / finding)", 0),
        ("agent_mark_reads", "agent: own node + ceiling view (mark about to be made)", 0),
        ("wrapper_poll_2", "wrapper poll: 2-node step", 0),
        ("wrapper_poll_64", "wrapper poll: 64-node step", 0),
        ("wrapper_job", "wrapper: job read (per attempt)", 0),
        ("controller_cycle", f"controller cycle, {REPAIRS} nodes to repair", 5)]


def run_child(name: str, conf: str, ctld: int, repeat: int, work: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", name, "--conf", conf, "--ctld", str(ctld),
                          "--repeat", str(repeat), "--work", work], check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def ratio(a: float, b: float) -> str:
    return f"{a / b:.4f}" if b > 0 else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extra-nodes", type=int, default=10_000)
    ap.add_argument("--base-port", type=int, default=int(os.environ.get("HPRESILIENCE_TEST_BASE_PORT", "18817")) + 400)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--child")
    ap.add_argument("--conf")
    ap.add_argument("--ctld", type=int)
    ap.add_argument("--work")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(scenario(args.child, args.conf, args.ctld, args.repeat, args.work)))
        return

    from hpresilience.agent.settings import AgentSettings
    from hpresilience.autoresume.settings import AutoResumeSettings
    from hpresilience.log import setup_logging
    from hpresilience.testing.devcluster import DevCluster

    setup_logging("error", json=True)
    with tempfile.TemporaryDirectory(prefix="hpr-bench-scale-") as tmp:
        cl = DevCluster(state_dir=Path(tmp) / "cluster", nodes=4, base_port=args.base_port, accounting=False,
                        extra_nodes=args.extra_nodes)
        t = time.monotonic()
        cl.up(timeout=120)
        print(f"devcluster: 4 real + {args.extra_nodes} powered-down p5 nodes, up in {time.monotonic() - t:.1f} s")
        try:
            client = cl.client(timeout=60)
            job = client.sbatch("-N2", "-w", "n1,n2", "-o", "/dev/null", "--wrap", "sleep 3600")
            client.wait_running(job)
            Path(tmp, "job").write_text(str(job))
            bad = [f"gpu-st-p5-{i}" for i in range(101, 101 + REPAIRS)]
            client.set_node_state(bad, "drain", "Action:Replace bench")
            ctld = cl.daemon_pids()["slurmctld"]
            c0, t0 = ctld_cpu(ctld), time.monotonic()
            time.sleep(5)
            idle = (ctld_cpu(ctld) - c0) / (time.monotonic() - t0)
            print(f"slurmctld idle CPU: {idle * 1000:.1f} ms/s (subtracted below)\n")
            rows = {}
            for name, _, rep in ROWS:
                r = run_child(name, str(cl.conf_path), ctld, rep or args.repeat, tmp)
                r["ctld"] = max(0.0, r["ctld"] - idle * r["elapsed"] / (rep or args.repeat))
                rows[name] = r
        finally:
            cl.down()
    full = rows["full"]
    hdr = (f"{'what':50} {'cmds':>5} {'bytes':>11} {'wall ms':>9} {'cpu ms':>8} {'peak MB':>8} {'ctld ms':>8}"
           f"   ratios vs full (bytes, wall, cpu, rss, ctld)")
    print(hdr)
    for name, label, _ in ROWS:
        r = rows[name]
        print(f"{label:50} {r['commands']:5.1f} {r['bytes']:11,.0f} {r['wall'] * 1000:9.1f} {r['cpu'] * 1000:8.1f} "
              f"{r['rss_mb']:8.1f} {r['ctld'] * 1000:8.2f}   "
              f"{ratio(r['bytes'], full['bytes'])}, {ratio(r['wall'], full['wall'])}, {ratio(r['cpu'], full['cpu'])}, "
              f"{ratio(r['rss_mb'], full['rss_mb'])}, {ratio(r['ctld'], full['ctld'])}")
    a, w = AgentSettings(), AutoResumeSettings()
    agents, jobs = 10_000, 200
    # Healthy agents ask nothing each cycle; each looks at its own node once per active-check interval.
    agent_now = agents * (rows["agent_cycle"]["ctld"] / a.passive_interval_s
                          + rows["agent_own_node"]["ctld"] / a.active_interval_s)
    agent_before = agents * full["ctld"] / a.passive_interval_s
    wrap_now = jobs * rows["wrapper_poll_2"]["ctld"] / w.poll_interval_s
    wrap_before = jobs * full["ctld"] / w.poll_interval_s
    print("\nprojected slurmctld load (CPU s per s), measured per-query costs above:")
    print(f"  {agents} agents, passive {a.passive_interval_s:g} s / active {a.active_interval_s:g} s: "
          f"{agent_now:.4f} now vs {agent_before:.2f} with a full-table read per cycle "
          f"(ratio {ratio(agent_now, agent_before)})")
    print(f"  {jobs} auto-resume jobs polling every {w.poll_interval_s:g} s: {wrap_now:.3f} now vs "
          f"{wrap_before:.2f} with a full-table read per poll (ratio {ratio(wrap_now, wrap_before)})")
    poll = rows["wrapper_poll_2"]
    print(f"\ntargets: agent healthy cycle 0 commands -> {rows['agent_cycle']['commands']:g}; wrapper poll <= 16 KB "
          f"-> {poll['bytes'] / 1000:.1f} KB, <= 50 ms CPU -> {poll['cpu'] * 1000:.1f} ms; "
          f"controller cycle ({REPAIRS} to repair) <= 300 ms CPU -> {rows['controller_cycle']['cpu'] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
