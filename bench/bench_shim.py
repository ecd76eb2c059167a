"""Latency the srun shim adds over running srun directly, in the same run.

Target (issue 4): at most 5 ms median added on the plain path (no --auto-resume). The real srun needs
a cluster, so a fake "srun" (a link to /bin/true) sits on PATH after the shim; each sample spawns either
the shim or that target directly, interleaved, with the same arguments and environment, and the
difference of the medians is the shim's cost. The auto-resume path is measured the same way up to the
exec of `hpresilience` (also /bin/true here: Python's start-up is the wrapper's cost, not the shim's).

    .venv/bin/python bench/bench_shim.py [--samples 400]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SHIM = Path(__file__).resolve().parent.parent / "slurm" / "srun"
ARGS = ["-N", "2", "--ntasks-per-node", "8", "--export=ALL", "python", "train.py", "--lr", "3e-4"]


def spawn(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env)
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[0]} failed with status {status}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=400)
    args = ap.parse_args()
    true = shutil.which("true")
    assert true is not None
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for sub in ("shim", "slurm", "hp"):
            (root / sub).mkdir()
        shutil.copy(SHIM, root / "shim" / "srun")
        (root / "slurm" / "srun").symlink_to(true)
        (root / "hp" / "hpresilience").symlink_to(true)
        # A PATH as long as a module-loaded HPC login shell's, with the shim first and srun last.
        fillers = [str(root / f"empty{i}") for i in range(8)]
        for f in fillers:
            Path(f).mkdir()
        env = {
            "PATH": ":".join([str(root / "shim"), *fillers, str(root / "slurm"), str(root / "hp"), "/usr/bin", "/bin"])
        }
        shim = str(root / "shim" / "srun")
        target = str(root / "slurm" / "srun")
        cases = {
            "plain srun (pass-through)": ([shim, *ARGS], [target, *ARGS]),
            "srun --auto-resume=1 (to the exec of hpresilience)": (
                [shim, "-N", "2", "--auto-resume=1", *ARGS[2:]],
                [str(root / "hp" / "hpresilience"), "srun", "--", *ARGS],
            ),
        }
        print(f"{args.samples} samples each, interleaved; target: a link to {true}")
        for label, (with_shim, direct) in cases.items():
            for _ in range(20):  # warm the page cache and the dynamic loader
                spawn(with_shim, env)
                spawn(direct, env)
            a, b = [], []
            for _ in range(args.samples):
                a.append(spawn(with_shim, env))
                b.append(spawn(direct, env))
            ma, mb = statistics.median(a), statistics.median(b)
            added = (ma - mb) * 1e3
            verdict = "OK" if added <= 5.0 else "OVER TARGET"
            print(
                f"{label:52s} direct {mb * 1e3:6.2f} ms, via shim {ma * 1e3:6.2f} ms median: "
                f"added {added:5.2f} ms [{verdict}, target <= 5 ms] ({ma / mb:4.2f}x the direct exec)"
            )


if __name__ == "__main__":
    main()
