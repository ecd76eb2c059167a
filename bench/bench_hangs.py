"""Sick, not dead, on a real local devcluster with HyperPod's recipe (torchrun on gloo, 2 nodes, no rules,
default thresholds): repeats the injections of tests/autoresume/test_sick_integration.py and prints

- hang: for each run, a rank (alternately 1 and 0, i.e. the non-batch and the batch node) stopped with
  SIGSTOP at step 8; `declared after` is the silence the wrapper measured from the last progress line it
  read to `hang_detected` (target: at the 60 s threshold; the loop wakes at the deadline), `evidence` the
  time spent collecting stacks and process states, and whether `hang_attributed` named the stopped rank's
  node, unambiguously (target: n of n). The job is cancelled after the attribution (nodes are not
  marked: mark_suspect_nodes is off here, so runs do not depend on each other);
- collective: a rank prints NCCL's watchdog message and aborts at step 8: seconds from the abort's line to
  the relaunched step running, and whether it ran on the same nodes;
- straggler: one rank 30 % slower per step: seconds from the first step to `straggler_detected` (target
  under 60 s), and whether the right node was named.

    .venv/bin/python bench/bench_hangs.py [--runs 4] [--base-port 21817]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=4, help="SIGSTOP injections (alternating ranks)")
    ap.add_argument("--base-port", type=int, default=int(os.environ.get("HPRESILIENCE_TEST_BASE_PORT", "21817")))
    args = ap.parse_args()
    os.environ["HPRESILIENCE_TEST_BASE_PORT"] = str(args.base_port)  # the recipe's torchrun port follows it

    import psutil

    from hpresilience.testing.devcluster import DevCluster
    from tests.autoresume.test_recipe_integration import Recipe
    from tests.autoresume.test_sick_integration import rank_process
    from tests.conftest import reset_cluster

    work = Path(tempfile.mkdtemp(prefix="hpr-bench-hangs-"))
    cl = DevCluster(state_dir=work / "cluster", nodes=4, base_port=args.base_port, overrides={"SlurmdTimeout": "5"})
    print(f"devcluster up in {cl.up(timeout=60):.1f} s", flush=True)
    slurm = cl.client()
    config = work / "config.yaml"
    config.write_text("autoresume:\n  mark_suspect_nodes: false\n")
    jobs: list[int] = []
    try:
        declared, right = [], 0
        for i in range(args.runs):
            reset_cluster(cl)
            rank = 1 - i % 2
            run = Recipe(cl, work / f"hang-{i}", steps=400, inject=True, extra_env={"HPRESILIENCE_CONFIG": str(config)})
            jobs.append(run.job_id)
            run.wait(lambda r=run: "step=8\n" in r.out, "step 8", timeout=120)
            victim = run.wait(lambda r=run, k=rank: rank_process(r.job_id, k), "the rank's process")
            node = victim.environ()["SLURMD_NODENAME"]
            victim.send_signal(signal.SIGSTOP)
            det = run.wait(lambda r=run: r.named("hang_detected"), "hang_detected", timeout=150)[0]
            att = run.wait(lambda r=run: r.named("hang_attributed"), "hang_attributed", timeout=60)[0]
            ok = att.get("node") == node and att.get("unambiguous") is True
            right += ok
            declared.append(det["silent_s"])
            print(
                f"hang run {i + 1}: rank {rank} on {node} stopped; declared after {det['silent_s']:.1f} s of "
                f"silence (threshold {det['threshold_s']:.0f} s), evidence {att['took_s']:.1f} s, named "
                f"{att.get('node')} unambiguous={att.get('unambiguous')}: {'right' if ok else 'WRONG'}",
                flush=True,
            )
            slurm.cancel(run.job_id)
            with contextlib.suppress(psutil.Error):
                victim.kill()
        if declared:
            print(
                f"hang: declared after {min(declared):.1f}-{max(declared):.1f} s (target <= 61 s), attribution "
                f"right in {right} of {len(declared)} runs",
                flush=True,
            )

        reset_cluster(cl)
        run = Recipe(
            cl, work / "collective", inject=True, extra_env={"INJECT_ABORT_RANK": "1", "INJECT_ABORT_STEP": "8"}
        )
        jobs.append(run.job_id)
        seen = run.wait(lambda: run.named("collective_failure_seen"), "collective_failure_seen", timeout=120)[0]
        running = run.wait(lambda: run.named("step_running"), "the relaunched step", timeout=120)[0]
        starts = run.named("attempt_started")
        same = len(starts) == 2 and starts[0]["nodes"] == starts[1]["nodes"]
        print(
            f"collective: {seen['kind']} -> step running again {running['time'] - seen['time']:.1f} s after the "
            f"failure was seen (settle window {seen['settle_s']:.0f} s), same nodes: {same}",
            flush=True,
        )
        run.wait(lambda: run.named("job_step_succeeded") or run.named("job_step_given_up"), "the end", timeout=120)
        print(f"collective: job {'completed' if run.named('job_step_succeeded') else 'FAILED'}", flush=True)

        reset_cluster(cl)
        run = Recipe(
            cl,
            work / "straggler",
            steps=400,
            inject=True,
            extra_env={"INJECT_SLOW_RANK": "1", "INJECT_SLOW_FACTOR": "1.3"},
        )
        jobs.append(run.job_id)
        run.wait(lambda: "step=1\n" in run.out, "step 1", timeout=120)
        began = time.time()
        flagged = run.wait(lambda: run.named("straggler_detected"), "straggler_detected", timeout=120)[0]
        slow = rank_process(run.job_id, 1)
        node = slow.environ()["SLURMD_NODENAME"] if slow else "?"
        print(
            f"straggler: flagged {flagged['node']} (slow rank on {node}) {flagged['time'] - began:.1f} s after "
            f"the first step (target < 60 s), ratio {flagged['ratio']}",
            flush=True,
        )
    finally:
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if p.environ().get("HPR_AUTORESUME_JOB") in {str(j) for j in jobs}:
                    p.kill()
        cl.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
