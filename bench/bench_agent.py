"""Node agent: fault detection latency (event path and poll path) and steady-state CPU and memory.

Runs real agents against a real devcluster, on recorded-hardware roots (hpresilience.testing.fakenode).
- event path: an `NVRM: Xid 79` line lands in the node's kernel log; time until Slurm shows the node FAIL.
- poll path: a GPU falls off NVML with nothing in the kernel log; found on the next passive cycle.
- steady state: CPU % of one core and RSS of an idle agent at its default 30 s interval, beside a bare
  Python interpreter measured the same way in the same run.
Targets (issue 3): event path <= 2 s, CPU <= 0.5 % of one core, RSS <= 60 MB.

    .venv/bin/python bench/bench_agent.py [--repeat 3] [--steady-s 60]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.fakenode import FakeNode


def start_agent(cl: DevCluster, node: FakeNode, name: str, interval: float) -> subprocess.Popen[bytes]:
    cfg = yaml.safe_load((node.root / "config.yaml").read_text())
    cfg["agent"] = {
        "node_name": name,
        "passive_interval_s": interval,
        "metrics_address": "",
        "state_dir": str(node.root / "agent"),
        "active_checks": False,
        "required_repeats": 1,
    }
    (node.root / "agent.yaml").write_text(yaml.safe_dump(cfg))
    return subprocess.Popen(
        [sys.executable, "-m", "hpresilience", "--config", str(node.root / "agent.yaml"), "agent"],
        env=cl.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def time_to_fail(cl: DevCluster, name: str, inject: object, timeout: float = 60.0) -> float:
    client = cl.client()
    t0 = time.monotonic()
    inject()  # type: ignore[operator]
    while time.monotonic() - t0 < timeout:
        if client.node(name).has("FAIL"):
            return time.monotonic() - t0
        time.sleep(0.02)
    raise SystemExit(f"{name} not FAIL after {timeout} s")


def measure_latency(cl: DevCluster, root: Path, fault: str, interval: float, repeat: int) -> list[float]:
    client = cl.client()
    out = []
    for i in range(repeat):
        node = FakeNode.make(root / f"{fault.split(':')[0]}-{i}", "p5.48xlarge")
        proc = start_agent(cl, node, "n1", interval)
        time.sleep(2.5)  # the agent is up and has run its first cycle
        out.append(time_to_fail(cl, "n1", lambda node=node: node.inject(fault)))
        proc.terminate()
        proc.wait(10)
        client.set_node_state(["n1"], "resume")
    return out


def steady_state(cl: DevCluster, root: Path, seconds: float) -> tuple[float, float, float, float]:
    node = FakeNode.make(root / "steady", "p5.48xlarge")
    agent = start_agent(cl, node, "n2", 30.0)
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    time.sleep(5)  # past start-up: imports and the first cycle are not steady state
    procs = [psutil.Process(agent.pid), psutil.Process(bare.pid)]
    cpu0 = [sum(p.cpu_times()[:2]) for p in procs]
    time.sleep(seconds)
    cpu1 = [sum(p.cpu_times()[:2]) for p in procs]
    rss = [p.memory_info().rss / 2**20 for p in procs]
    for p in (agent, bare):
        p.terminate()
        p.wait(10)
    return ((cpu1[0] - cpu0[0]) / seconds * 100, rss[0], (cpu1[1] - cpu0[1]) / seconds * 100, rss[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steady-s", type=float, default=60.0)
    ap.add_argument("--poll-interval", type=float, default=5.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpr-bench-agent-") as tmp:
        cl = DevCluster(Path(tmp) / "cluster", nodes=2, base_port=23817)
        cl.up()
        try:
            ev = measure_latency(cl, Path(tmp), "xid:79:3", 30.0, args.repeat)
            poll = measure_latency(cl, Path(tmp), "gpu_lost:2", args.poll_interval, args.repeat)
            cpu, rss, cpu0, rss0 = steady_state(cl, Path(tmp), args.steady_s)
        finally:
            cl.down()
    print(
        f"fault detection, event path (XID 79 in the kernel log -> node FAIL in Slurm): "
        f"median {statistics.median(ev):.2f} s, max {max(ev):.2f} s over {len(ev)} (target <= 2 s); "
        f"passive interval was 30 s, so the event path is {30 / statistics.median(ev):.0f}x faster than polling"
    )
    print(
        f"fault detection, poll path (GPU lost in NVML, {args.poll_interval:g} s interval): "
        f"median {statistics.median(poll):.2f} s, max {max(poll):.2f} s over {len(poll)} "
        f"(bounded by the interval: {statistics.median(poll) / args.poll_interval:.2f} intervals)"
    )
    print(
        f"steady state over {args.steady_s:g} s at the default 30 s interval: agent CPU {cpu:.3f} % of one core "
        f"(target <= 0.5 %), RSS {rss:.1f} MB (target <= 60 MB); bare python interpreter: CPU {cpu0:.3f} %, "
        f"RSS {rss0:.1f} MB; agent/bare RSS = {rss / rss0:.1f}x"
    )


if __name__ == "__main__":
    main()
