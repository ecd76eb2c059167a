#!/usr/bin/env python3
"""What Slurm does to a step's tasks on the other nodes when one node of the job is lost (docs/slurm-notes.md,
"Losing one node of a step"). Starts a 3-node devcluster on port 29900 (HPR_NODE_LOSS_PORT), runs a `--no-kill`
job with either one 2-node step on n2,n3 (`multi`) or a 1-node step on each (`pernode`), loses n2 one way, and
prints the job's steps and which nodes still run a task.

    PYTHONPATH=. python scripts/slurm_node_loss.py fail|task|dead multi|pernode
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from hpresilience.testing.devcluster import DevCluster

MULTI = "srun -N2 -n2 -w n2,n3 --kill-on-bad-exit=0 -J multi sleep 301 > {d}/multi.out 2>&1 &\n"
PERNODE = (
    "srun -N1 -n1 -w n2 -J one-n2 sleep 301 > {d}/one-n2.out 2>&1 &\n"
    "srun -N1 -n1 -w n3 -J one-n3 sleep 301 > {d}/one-n3.out 2>&1 &\n"
)


def main(how: str, shape: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="node-loss-"))
    port = int(os.environ.get("HPR_NODE_LOSS_PORT", "29900"))
    cl = DevCluster(work / "cluster", 3, port, {"SlurmdTimeout": "10"}, accounting=False, proctrack="pgid")
    cl.up(timeout=60)
    env = cl.env()

    def sh(*argv: str) -> str:
        res = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=30)
        return (res.stdout + res.stderr).strip()

    def tasks_on() -> list[str]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                c = p.info["cmdline"] or []
                if len(c) == 2 and c[0].endswith("sleep") and c[1] == "301":
                    found.append(p.environ().get("SLURMD_NODENAME", "?"))
            except psutil.Error:
                pass
        return sorted(found)

    def kill_tasks_on(node: str) -> None:
        for p in psutil.process_iter(["cmdline"]):
            try:
                c = p.info["cmdline"] or []
                if len(c) == 2 and c[1] == "301" and p.environ().get("SLURMD_NODENAME") == node:
                    p.kill()
            except psutil.Error:
                pass

    def show(when: str) -> None:
        steps = sh("squeue", "-s", "-j", job, "-h", "-o", "%i %j %N")
        print(f"-- {when}\n{steps or '(no steps)'}\ntasks running on: {tasks_on()}", flush=True)

    script = work / "job.sh"
    script.write_text("#!/bin/bash\n" + (MULTI if shape == "multi" else PERNODE).format(d=work) + "wait\n")
    job = sh("sbatch", "--parsable", "--no-kill", "-N3", "-o", str(work / "job.out"), str(script))
    try:
        time.sleep(4)
        show("running")
        if how == "fail":
            sh("scontrol", "update", "node=n2", "state=fail", "reason=Action:Replace")
            time.sleep(5)
            show("n2 set FAIL (Action:Replace)")
            sh("scontrol", "update", f"jobid={job}", "NodeList=n[1,3]")
            time.sleep(5)
            show("n2 released from the job")
        elif how == "task":
            kill_tasks_on("n2")
            time.sleep(4)
            show("n2's task killed")
        else:
            cl.kill_node("n2")
            kill_tasks_on("n2")
            time.sleep(4)
            show("n2's slurmd and task killed, 4 s later")
            time.sleep(25)
            show("30 s later (SlurmdTimeout=10)")
            print("job:", sh("squeue", "-j", job, "-h", "-o", "%T %N") or "(ended)")
        for out in sorted(work.glob("*.out")):
            print(f"{out.name}: {out.read_text().strip()[:400]}")
    finally:
        sh("scancel", job)
        time.sleep(2)
        cl.down()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
