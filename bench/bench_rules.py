"""Log-rule throughput, lines per second for one rule set, against a naive evaluator in the same run.

Target (issue 4): at least 500k lines/s per rule set. The rule set is the four rules of AWS's
HyperPodPyTorchJob example (start, hang, checkpoint, throughput). Output arrives as 64 KiB chunks
through LineBuffer, as the wrapper reads a pipe. Two logs:
- "mixed": 5 % progress lines among NCCL/INFO chatter (what a verbose multi-rank job prints);
- "all progress": every line is a progress line, so the metric rule must run its regex on each (worst case).
Baseline, same run: HyperPod's own way (`re.match` of every rule on every line) and a bare loop that only
splits the same text into lines, to show how close to the floor the engine is.
Last, the catastrophic pattern `(a+)+$` (issue 14): Python's `re` on short hostile lines, the engine on
a 41-character one and on a full 64 KiB one (target: decided in under 1 s).

    .venv/bin/python bench/bench_rules.py [--lines 400000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import random
import re
import time
from collections.abc import Callable

import yaml

from hpresilience.autoresume.settings import LogRuleSettings, RunPolicySettings
from hpresilience.autoresume.watch.lines import LineBuffer
from hpresilience.autoresume.watch.rules import RuleSet

RULES = r"""
- name: JobStart
  logPattern: ".*Experiment configuration.*"
  expectedStartCutOffInSeconds: 120
- name: JobHangingDetection
  logPattern: ".*\\[Epoch 0 Batch \\d+.*'training_loss_step': (\\d+(\\.\\d+)?).*"
  expectedRecurringFrequencyInSeconds: 300
  expectedStartCutOffInSeconds: 600
- name: NoS3CheckpointingDetection
  logPattern: ".*The checkpoint is finalized. All shards is written.*"
  expectedRecurringFrequencyInSeconds: 600
  expectedStartCutOffInSeconds: 1800
- name: LowThroughputDetection
  logPattern: ".*\\[Epoch 0 Batch \\d+.*'samples\\/sec': (\\d+(\\.\\d+)?).*"
  metricThreshold: 80
  operator: lteq
  metricEvaluationDataPoints: 25
"""

CHATTER = [
    "ip-10-1-2-3:1234:5678 [3] NCCL INFO Channel 05/32 : 3[3] -> 4[4] via P2P/CUMEM/read",
    "ip-10-1-2-3:1234:5678 [3] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "2025-01-01 12:00:00,123 [INFO] torch.distributed: rank 17 reached barrier 'after_load'",
    "2025-01-01 12:00:00,124 [WARNING] dataloader: worker 3 slow to prefetch, queue depth 1",
    '  warnings.warn("TypedStorage is deprecated", UserWarning)',
]


def progress(i: int, rnd: random.Random) -> str:
    return (
        f"2025-01-01 12:00:00,125 [INFO] [Epoch 0 Batch {i} Global step {i}] {{'training_loss_step': "
        f"{rnd.uniform(1, 3):.4f}, 'samples/sec': {rnd.uniform(90, 120):.2f}, 'lr': 0.0003}}"
    )


def make_log(n: int, share: float, seed: int = 1) -> bytes:
    rnd = random.Random(seed)
    lines = [progress(i, rnd) if rnd.random() < share else rnd.choice(CHATTER) for i in range(n)]
    lines.insert(10, "Experiment configuration: {...}")
    return ("\n".join(lines) + "\n").encode()


def chunks(data: bytes, size: int = 65536) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def engine(pieces: list[bytes], rules: RunPolicySettings) -> int:
    rs = RuleSet(rules.log_monitoring_configuration)
    lb = LineBuffer()
    events = 0
    for k, piece in enumerate(pieces):
        events += len(rs.feed_text(lb.push(piece), k * 0.001))
    return events


def naive(pieces: list[bytes], rules: RunPolicySettings) -> int:
    """HyperPod's agent loop: every rule's re.match on every line."""
    compiled = [re.compile(r.log_pattern) for r in rules.log_monitoring_configuration]
    hits = 0
    tail = b""
    for piece in pieces:
        buf = tail + piece
        cut = buf.rfind(b"\n") + 1
        tail = buf[cut:]
        for line in buf[:cut].decode("utf-8", "replace").split("\n"):
            for rx in compiled:
                m = rx.match(line)
                if m is not None and m.groups():
                    hits += float(m.group(1)) <= 80
    return hits


def floor(pieces: list[bytes], rules: RunPolicySettings) -> int:
    """Only split the same chunks into decoded lines: no engine can be cheaper than this."""
    n = 0
    for piece in pieces:
        for _line in piece.decode("utf-8", "replace").split("\n"):
            n += 1
    return n


def best(fn: Callable[[], int], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=400_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rules = RunPolicySettings.model_validate({"logMonitoringConfiguration": yaml.safe_load(RULES)})
    print(
        f"{len(rules.log_monitoring_configuration)} rules (AWS example set), {args.lines} lines, best of {args.repeat}"
    )
    for label, share in (("mixed (5% progress lines)", 0.05), ("all progress lines", 1.0)):
        data = make_log(args.lines, share)
        pieces = chunks(data)
        n = data.count(b"\n")
        t_engine = best(functools.partial(engine, pieces, rules), args.repeat)
        t_naive = best(functools.partial(naive, pieces, rules), args.repeat)
        t_floor = best(functools.partial(floor, pieces, rules), args.repeat)
        rate = n / t_engine
        verdict = "OK" if rate >= 500_000 else "UNDER TARGET"
        print(
            f"{label:28s} engine {rate / 1e3:8.0f}k lines/s [{verdict}, target 500k]; "
            f"naive re.match {n / t_naive / 1e3:6.0f}k lines/s (engine {t_naive / t_engine:4.1f}x faster); "
            f"split-only floor {n / t_floor / 1e3:6.0f}k lines/s (engine at {t_floor / t_engine:4.0%} of it)"
        )
    hostile()


def hostile() -> None:
    """Issue 14: a catastrophic pattern on a hostile line. Python's `re` (HyperPod's engine) is timed on
    short lines only (each extra character doubles its time); the engine on 40 and on 64 KiB."""
    evil = LogRuleSettings.model_validate({"name": "Evil", "logPattern": "(a+)+$", "faultOnMatch": True})
    rx = re.compile(evil.log_pattern)
    for n in (16, 20, 22):
        t = time.perf_counter()
        rx.match("a" * n + "!")
        print(
            f"hostile (a+)+$  re.match on {n + 1:2d} chars {time.perf_counter() - t:9.4f} s "
            "(doubles with each character: 40 chars would take days)"
        )
    for n in (40, 65535):
        rs = RuleSet([evil])
        t = time.perf_counter()
        events = rs.feed("a" * n + "!", 1.0)
        took = time.perf_counter() - t
        print(
            f"hostile (a+)+$  engine   on {n + 1:5d} chars {took:9.6f} s, {len(events)} trips "
            f"[{'OK' if took < 1 else 'TOO SLOW'}, target < 1 s]"
        )


if __name__ == "__main__":
    main()
