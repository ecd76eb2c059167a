"""What a hostile ledger costs the controller's /metrics scrape (issue 31, point 4).

Builds, in a temporary directory, two jobs' `.hpresilience/jobs/<id>.events.jsonl` as their user could:
job 1's is a FIFO; job 2's is 64 MiB of 500,000 restart pairs (`attempt_started` + `fault_seen`, the shape
whose pairing used to be quadratic: about 2 h of CPU), with escape sequences in causes, `1e999`, NaN and
400-digit numbers, and overlong lines spread through it. Then one scrape of the controller's goodput
collector reads both (sacct is replaced by the two records), and a second scrape follows at once.

Printed: the wall and CPU time of each scrape, what the reader kept (records, bytes, why it stopped), and
the peak memory of the process doing it (ru_maxrss, beside that of the same process before reading). Run
in a child process per measure, so each peak is its own. `--max-records N` lifts the reader's record cap,
to show the whole 64 MiB read and paired (the work stays linear):

    .venv/bin/python bench/bench_ledger_hostile.py [--pairs 500000] [--mib 64] [--max-records 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ESC = "\x1b]2;owned\x07\x1b[2J"
FIFO_SERIES = 'job_id="1"'


def build(work: Path, pairs: int, mib: int) -> None:
    jobs = work / ".hpresilience" / "jobs"
    jobs.mkdir(parents=True)
    os.mkfifo(jobs / "1.events.jsonl")
    size = mib * 1024 * 1024
    hostile = [
        '{"event": "attempt_started", "time": 1e999, "attempt": 1e999}',
        '{"event": "attempt_ended", "time": NaN, "step_s": Infinity}',
        '{"event": "attempt_ended", "time": 5, "first_step": 1' + "0" * 400 + "}",
        json.dumps({"event": "fault_seen", "time": 5, "cause": f"hw{ESC}\nfake", "nodes": "n1," * 2000}),
    ]
    with open(jobs / "2.events.jsonl", "w") as f:  # the pairs come first: past 64 MiB nothing is read
        written = 0
        for i in range(pairs):
            pair = (
                f'{{"event":"attempt_started","time":{i},"attempt":{i + 1}}}\n'
                f'{{"event":"fault_seen","time":{i},"cause":"hardware"}}\n'
            )
            if i % 1000 == 0:
                pair += "\n".join(hostile) + "\n"
            if i % 100_000 == 0:
                pair += "x" * 100_000 + "\n"  # a line past the reader's 64 KiB
            f.write(pair)
            written += len(pair)
        filler = '{"event":"step_running","time":1,"cause":"' + ESC.replace("\x1b", "\\u001b") + '"}\n'
        while written < size:
            f.write(filler)
            written += len(filler)
        f.truncate(size)


def measure(work: str, max_records: int) -> None:
    """In the child: the collector's refresh over the FIFO job and the 64 MiB one (what reading them costs
    the controller), then scrapes: one that starts a refresh, one that arrives while it runs."""
    from prometheus_client import CollectorRegistry, generate_latest

    from hpresilience.goodput import ledgermetrics, ledgerread
    from hpresilience.goodput.ledgermetrics import LedgerCollector
    from hpresilience.slurm.accounting import JobRecord
    from hpresilience.slurm.client import SlurmClient

    timeout = 3600.0 if max_records != ledgerread.MAX_RECORDS else ledgerread.READ_TIMEOUT_S
    ledgerread.MAX_RECORDS = max_records
    user = pwd.getpwuid(os.getuid()).pw_name
    records = [JobRecord(j, user, "gpu", work, "COMPLETED", "", "") for j in (1, 2)]

    def listed(client: SlurmClient, since_s: int, user: str = "", partition: str = "") -> list[JobRecord]:
        return records  # what sacct would list: the two jobs

    setattr(ledgermetrics, "finished_jobs", listed)  # noqa: B010 - replacing sacct for the bench
    collector = LedgerCollector(SlurmClient(), refresh_s=0, read_timeout_s=timeout, budget_s=timeout)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t, c = time.perf_counter(), time.process_time()
    collector.refresh()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    seen = collector.jobs.get(2)
    led = seen.ledger if seen else None
    print(
        f"refresh (reads both ledgers): {wall:.2f} s wall, {cpu:.2f} s CPU; the FIFO job: "
        f"{'read' if 1 in collector.jobs else 'refused'}; the 64 MiB job: "
        + (f"{led.attempts} attempts, {len(led.restarts)} restarts, notes {led.notes[-1:]}" if led else "none")
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak RSS: {peak / 1024:.0f} MiB (before reading: {before / 1024:.0f} MiB)")
    collector.jobs.clear()
    reg = CollectorRegistry()
    reg.register(collector)  # (prometheus_client collects once here: that refreshes)
    took: list[float] = []

    def first() -> None:
        t = time.perf_counter()
        generate_latest(reg)
        took.append(time.perf_counter() - t)

    a = threading.Thread(target=first)
    a.start()
    while collector.worker is None and a.is_alive():
        time.sleep(0.01)
    t = time.perf_counter()
    body = generate_latest(reg).decode()
    second = time.perf_counter() - t
    a.join()
    print(
        f"scrape that starts a refresh: {took[0]:.2f} s wall (waits at most wait_s={collector.wait_s:.0f} s); "
        f"a scrape meanwhile: {second:.3f} s wall; FIFO job exported: {FIFO_SERIES in body}; "
        f"ESC in /metrics: {chr(27) in body}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=500_000)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--max-records", type=int, default=0, help="the reader's record cap (0: its default)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        from hpresilience.goodput.ledgerread import MAX_RECORDS

        measure(args.child, args.max_records or MAX_RECORDS)
        return
    with tempfile.TemporaryDirectory(prefix="hpr-bench-ledger-") as tmp:
        t = time.perf_counter()
        build(Path(tmp), args.pairs, args.mib)
        size = (Path(tmp) / ".hpresilience" / "jobs" / "2.events.jsonl").stat().st_size
        print(f"built {size / 2**20:.0f} MiB, {args.pairs} restart pairs, in {time.perf_counter() - t:.1f} s")
        cmd = [sys.executable, __file__, "--child", tmp, "--max-records", str(args.max_records)]
        subprocess.run(cmd, check=True, timeout=3600)


if __name__ == "__main__":
    main()
