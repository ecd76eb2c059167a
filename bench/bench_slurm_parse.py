"""Parsing a 10,000-node cluster's node list, in both JSON dialects, and the filtered reads that replace it.

Records are real-size: `scontrol --json show node` (v0.0.41) nodes are built from node_p5_v0.0.41.json, a
p5.48xlarge node written in the field layout of real v0.0.40-v0.0.44 records (every field they carry, 2.9 KB
as scontrol prints it, inside the 2.3-3.4 KB of real ones); `sinfo --json` (v0.0.38) nodes from the 22.05
recording. Both are printed indented, as the commands print them. Then what a wrapper poll parses instead:
a 2-node `scontrol show node -o` answer (22.05) and a 2-node `scontrol --json show node` answer (23.02+).

Target (foundation issue): under 1 s for `scontrol --json show node` of 10,000 nodes. The figure is
shown beside json.loads of the same text in the same run, since this machine is shared and noisy.

    .venv/bin/python bench/bench_slurm_parse.py [--nodes 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

from hpresilience.slurm.parse import parse_nodes_oneliner
from hpresilience.slurm.parsejson import parse_nodes_json

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "slurm"


def generate(template_file: str, count: int) -> str:
    """`count` nodes shaped like the template's: names gpu-st-p5-1..N, states and reasons cycling; indented
    as Slurm prints it."""
    doc: dict[str, Any] = json.loads((FIXTURES / template_file).read_text())
    templates = doc["nodes"]
    nodes = []
    for i in range(count):
        node = copy.deepcopy(templates[i % len(templates)])
        node["name"] = f"gpu-st-p5-{i + 1}"
        node["address"] = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
        node["hostname"] = f"ip-10-0-{(i >> 8) & 255}-{i & 255}"
        if len(templates) == 1 and i % 50 == 7:  # one node in 50 drained with a reason, as on a real cluster
            node["state"] = ["IDLE", "DRAIN"]
            node["reason"] = "Action:Replace [hpr-agent] xid=79 GPU has fallen off the bus"
        nodes.append(node)
    doc["nodes"] = nodes
    return json.dumps(doc, indent=2)


def best_of(fn: Any, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    for label, fixture in (
        ("scontrol --json show node (v0.0.41)", "node_p5_v0.0.41.json"),
        ("sinfo --json (v0.0.38, Slurm 22.05)", "sinfo_v0.0.38.json"),
    ):
        text = generate(fixture, args.nodes)
        n = len(parse_nodes_json(text))
        assert n == args.nodes
        best, med = best_of(lambda text=text: parse_nodes_json(text), args.repeat)
        base, _ = best_of(lambda text=text: json.loads(text), args.repeat)
        verdict = "OK" if med < 1.0 else "OVER TARGET"
        print(
            f"{label}: {n} nodes, {len(text) / 1e6:.1f} MB: parse best {best * 1000:.0f} ms, "
            f"median {med * 1000:.0f} ms (target < 1000 ms: {verdict}); json.loads alone {base * 1000:.0f} ms, "
            f"parse/json.loads = {best / base:.2f}x; {len(text) / n / 1000:.1f} KB per node"
        )
    # What one wrapper poll of a 2-node step parses now, against the 10,000-node JSON of the same run.
    full = generate("node_p5_v0.0.41.json", args.nodes)
    full_t, _ = best_of(lambda: parse_nodes_json(full), max(1, args.repeat // 2))
    two_json = generate("node_p5_v0.0.41.json", 2)
    lines = (FIXTURES / "show_node_oneliner_22.05.txt").read_text().splitlines()[:2]
    two_text = "\n".join(lines) + "\n"
    cases = (
        ("2 nodes, scontrol --json show node (23.02+)", lambda: parse_nodes_json(two_json), len(two_json)),
        ("2 nodes, scontrol show node -o (22.05)", lambda: parse_nodes_oneliner(two_text), len(two_text)),
    )
    for label, fn, size in cases:
        t, _ = best_of(lambda fn=fn: [fn() for _ in range(100)], args.repeat)
        print(
            f"{label}: {size / 1000:.1f} KB, parse {t * 10:.3f} ms; ratio to the {args.nodes}-node parse "
            f"{t / 100 / full_t:.6f}"
        )


if __name__ == "__main__":
    main()
