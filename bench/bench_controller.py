"""The replacement controller: its poll cost on a 10,000-node cluster, and the time to repair a devcluster node.

1. Poll cost: one cycle = parse one `sinfo --json` answer (Slurm 22.05 shape, generated like
   bench_slurm_parse.py's) + pick up / advance every repair. Shown beside json.loads of the same text
   (the floor any cycle pays) measured in the same run; 1 node in 200 asks for a repair.
2. Repair time (--devcluster): from `scontrol update node=n2 state=fail reason=Action:Replace` to n2 back
   idle, through the controller (script provider restarting slurmd, no gate, poll 0.5 s). Shown beside the
   same work done by hand in the same run (restart slurmd, wait for it to register, resume, wait idle).

    .venv/bin/python bench/bench_controller.py [--nodes 10000] [--repeat 5] [--devcluster] [--base-port 19990]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import io
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hpresilience.controller.loop import Controller
from hpresilience.controller.settings import ControllerSettings
from hpresilience.log import setup_logging
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.parsejson import parse_nodes_json
from hpresilience.testing.devcluster import DevCluster

HERE = Path(__file__).resolve().parent


@functools.cache
def _sibling() -> Any:
    """bench_slurm_parse.py, for its fixture generator and timing helper."""
    spec = importlib.util.spec_from_file_location("bench_slurm_parse", HERE / "bench_slurm_parse.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _generate(count: int) -> str:
    doc: dict[str, Any] = json.loads(_sibling().generate("sinfo_v0.0.38.json", count))
    for i, node in enumerate(doc["nodes"]):
        if "Action:" in (node.get("reason") or "") and i % 200 != 1:
            node["reason"], node["state_flags"] = "", []
    return json.dumps(doc)


def best(fn: Any, repeat: int) -> tuple[float, float]:
    """(best, median) seconds of `repeat` calls."""
    result: tuple[float, float] = _sibling().best_of(fn, repeat)
    return result


def poll_cost(count: int, repeat: int) -> None:
    text = _generate(count)
    with tempfile.TemporaryDirectory() as tmp:
        settings = ControllerSettings(
            state_dir=tmp,
            gate={"kind": "none"},
            metrics_address="",  # type: ignore[arg-type]
            forced_down_after_s=1e9,
        )
        ctl = Controller(settings, SlurmClient())
        nodes = parse_nodes_json(text)
        ctl.process(nodes, time.time())  # first cycle: picks the requests up and writes their records
        asking = len(ctl.records)
        base, _ = best(lambda: json.loads(text), repeat)
        parse_b, _ = best(lambda: parse_nodes_json(text), repeat)
        proc_b, proc_m = best(lambda: ctl.process(nodes, time.time()), repeat)
        cycle_b, cycle_m = best(lambda: ctl.process(parse_nodes_json(text), time.time()), repeat)
        ctl.pool.shutdown()
    print(f"poll cost, {count} nodes ({len(text) / 1e6:.1f} MB of sinfo --json, {asking} asking for repair):")
    print(f"  json.loads alone      {base * 1000:7.0f} ms (baseline)")
    print(f"  parse to Node objects {parse_b * 1000:7.0f} ms  = {parse_b / base:.2f}x baseline")
    print(
        f"  controller decisions  {proc_b * 1000:7.0f} ms  = {proc_b / base:.2f}x baseline (median "
        f"{proc_m * 1000:.0f} ms)"
    )
    print(
        f"  whole cycle           {cycle_b * 1000:7.0f} ms  = {cycle_b / base:.2f}x baseline (median "
        f"{cycle_m * 1000:.0f} ms); slurmctld's own time to answer is not included"
    )


def _wait(probe: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.05)


def repair_time(base_port: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cl = DevCluster(Path(tmp) / "cluster", nodes=2, base_port=base_port, overrides={"SlurmdTimeout": "5"})
        cl.up(timeout=60)
        try:
            client = cl.client()
            by_hand, controller = [], []
            for i in range(repeat):
                t = time.perf_counter()
                before = client.node("n2").slurmd_start_time
                client.set_node_state(["n2"], "drain", "bench: by hand")
                cl.restart_node("n2")
                _wait(lambda b=before: (n := client.node("n2")).slurmd_start_time != b and not n.has("NOT_RESPONDING"))
                client.set_node_state(["n2"], "resume")
                _wait(lambda: client.node("n2").is_idle)
                by_hand.append(time.perf_counter() - t)

                provider = Path(tmp) / "provider.sh"
                provider.write_text(
                    f'#!/bin/sh\nexec "{sys.executable}" -m hpresilience devcluster restart-node '
                    f'"$1" --state-dir "{cl.state_dir}" >/dev/null 2>&1\n'
                )
                provider.chmod(0o755)
                settings = ControllerSettings.model_validate(
                    {
                        "poll_interval_s": 0.5,
                        "state_dir": f"{tmp}/state{i}",
                        "metrics_address": "",
                        "default_provider": "script",
                        "default_options": {"command": [str(provider)]},
                        "gate": {"kind": "none"},
                    }
                )
                ctl = Controller(settings, client)
                th = threading.Thread(target=ctl.run, daemon=True)
                th.start()
                t = time.perf_counter()
                client.set_node_state(["n2"], "fail", "Action:Replace")
                _wait(lambda: client.node("n2").is_idle)
                controller.append(time.perf_counter() - t)
                ctl.stop()
                th.join(30)
        finally:
            cl.down()
    hand, ctl_t = statistics.median(by_hand), statistics.median(controller)
    print(f"repair time on the devcluster (median of {repeat}):")
    print(f"  by hand (restart slurmd, wait registered, resume, wait idle) {hand:6.2f} s (baseline)")
    print(
        f"  controller (reason set -> node idle, poll 0.5 s)             {ctl_t:6.2f} s = {ctl_t / hand:.2f}x "
        f"baseline (best {min(controller):.2f} s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--devcluster", action="store_true", help="Also time a repair on a real local Slurm cluster.")
    ap.add_argument("--base-port", type=int, default=19990)
    args = ap.parse_args()
    setup_logging(level="error", json=True, stream=io.StringIO())  # the figures, not the decision lines
    poll_cost(args.nodes, args.repeat)
    if args.devcluster:
        repair_time(args.base_port, min(args.repeat, 3))


if __name__ == "__main__":
    main()
