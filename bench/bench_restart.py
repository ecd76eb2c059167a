"""Restart latency: srun --auto-resume with a hot spare vs Slurm's own requeue of the same job, same run.

Both runs use a real local devcluster and the same shell trainer. The clock starts when a node of the
job is marked bad (auto-resume: `state=fail reason=Action:Replace`; Slurm's path: `state=down`, which is
what makes slurmctld requeue a job) and stops when the trainer prints its first line on the new nodes.

    .venv/bin/python bench/bench_restart.py [--base-port 21817] [--timeout 300]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.devcluster import DevCluster

REPO = Path(__file__).resolve().parents[1]
TRAINER = REPO / "tests" / "autoresume" / "data" / "trainer.sh"


def wait_text(path: Path, text: str, timeout: float, after: int = 0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text(errors="replace").count(text) > after:
            return time.monotonic()
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {text!r} in {path}")


def submit(cl: DevCluster, slurm: SlurmClient, work: Path, nodes: int, body: str, *flags: str) -> int:
    script = work / "job.sh"
    script.write_text("#!/bin/bash\n" + body + "\n")
    env = cl.env()
    env.update({"PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}", "CKPT_DIR": str(work),
                "TRAIN_STEPS": "100000", "STEP_SLEEP": "0.2"})
    return slurm.sbatch(f"--nodes={nodes}", f"--output={work}/out", f"--error={work}/err", *flags, str(script),
                        env=env)


def auto_resume(cl: DevCluster, slurm: SlurmClient, work: Path, timeout: float) -> float:
    job = submit(cl, slurm, work, 3, f"hpresilience srun --auto-resume=1 --auto-resume-spares=1 "
                 f"--auto-resume-state-dir={work}/state --auto-resume-poll-interval=0.5 {TRAINER}", "--no-kill")
    wait_text(work / "out", "step=3 ", timeout)
    t0 = time.monotonic()
    slurm.set_node_state(["n2"], "fail", "Action:Replace")
    t1 = wait_text(work / "out", "attempt=2", timeout)
    slurm.cancel(job)
    return t1 - t0


def slurm_requeue(cl: DevCluster, slurm: SlurmClient, work: Path, timeout: float) -> float:
    job = submit(cl, slurm, work, 2, f"srun --nodes=2 --kill-on-bad-exit=1 {TRAINER}", "--requeue",
                 "--open-mode=append")
    wait_text(work / "out", "step=3 ", timeout)
    starts = (work / "out").read_text().count("resume_from=")
    t0 = time.monotonic()
    slurm.set_node_state(["n2"], "down", "bench: node lost")
    t1 = wait_text(work / "out", "resume_from=", timeout, after=starts)
    slurm.cancel(job)
    return t1 - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-port", type=int, default=21817)
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpr-bench-restart-") as tmp:
        cl = DevCluster(Path(tmp) / "cluster", nodes=4, base_port=args.base_port, overrides={"SlurmdTimeout": "5"})
        cl.up(timeout=60)
        try:
            slurm = cl.client()
            results = {}
            for name, fn in (("auto_resume_hot_spare", auto_resume), ("slurm_requeue", slurm_requeue)):
                work = Path(tmp) / name
                work.mkdir()
                results[name] = fn(cl, slurm, work, args.timeout)
                for n in slurm.nodes():
                    if n.has("FAIL", "DOWN", "DRAIN"):
                        try:
                            slurm.set_node_state([n.name], "resume")
                        except Exception:  # noqa: BLE001 - a node resuming by itself races with us
                            pass
                time.sleep(2)
        finally:
            cl.down()
    ar, rq = results["auto_resume_hot_spare"], results["slurm_requeue"]
    print("restart latency, node marked bad -> training output on the new nodes (same devcluster, same run):")
    print(f"  srun --auto-resume, hot spare : {ar:7.2f} s")
    print(f"  Slurm requeue of the same job : {rq:7.2f} s")
    print(f"  speed-up                      : {rq / ar:7.1f}x  (goal >= 5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
