"""Parsing a 10,000-node cluster's node list, in both JSON dialects.

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

from hpresilience.slurm.parse import parse_nodes_json

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "slurm"


def generate(template_file: str, count: int) -> str:
    """`count` nodes shaped like the recorded ones: names n1..nN, states and reasons cycling."""
    doc: dict[str, Any] = json.loads((FIXTURES / template_file).read_text())
    templates = doc["nodes"]
    nodes = []
    for i in range(count):
        node = copy.deepcopy(templates[i % len(templates)])
        node["name"] = f"gpu-st-p5-{i + 1}"
        node["address"] = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
        node["hostname"] = f"ip-10-0-{(i >> 8) & 255}-{i & 255}"
        nodes.append(node)
    doc["nodes"] = nodes
    return json.dumps(doc)


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
    for label, fixture in (("scontrol --json show node (v0.0.41)", "scontrol_show_node_v0.0.41.json"),
                           ("sinfo --json (v0.0.38, Slurm 22.05)", "sinfo_v0.0.38.json")):
        text = generate(fixture, args.nodes)
        n = len(parse_nodes_json(text))
        assert n == args.nodes
        best, med = best_of(lambda text=text: parse_nodes_json(text), args.repeat)
        base, _ = best_of(lambda text=text: json.loads(text), args.repeat)
        verdict = "OK" if med < 1.0 else "OVER TARGET"
        print(f"{label}: {n} nodes, {len(text) / 1e6:.1f} MB: parse best {best * 1000:.0f} ms, "
              f"median {med * 1000:.0f} ms (target < 1000 ms: {verdict}); json.loads alone {base * 1000:.0f} ms, "
              f"parse/json.loads = {best / base:.2f}x")


if __name__ == "__main__":
    main()
