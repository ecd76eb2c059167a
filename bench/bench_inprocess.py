"""Fault -> every rank training again, in-process recovery against the relaunch path, in one run (issue 33).

The same data-parallel job (examples/checkpointless/train.py: gloo, 2 ranks per node, 2 training nodes + 1 spare,
no checkpoint) runs twice on a local devcluster, and each time an operator marks a training node
`state=fail reason=Action:Replace` after step 10:

1. `--auto-resume-mode=inprocess --auto-resume-standby=off`: the survivors keep running; printed with its
   parts: the node watch's detection, the new world written (the failed node's step cancelled, the spare taken),
   the survivors out of their old group, and the last rank (the replacement's, launched then: it imports torch
   and builds the model first) in the new world with its state; then the first step completed after the fault;
2. `--auto-resume-mode=inprocess` with its warm standby (the default with a spare): the spare's ranks were
   started with the job and wait with torch imported and the model built; the same parts, the replacement's
   "ready" being when it saw its assignment;
3. `--auto-resume-mode=inprocess` with its warm standby, the node dying outright instead (its slurmd and its ranks
   killed, nobody marks it): its step's end is seen, every node of it is asked to run a trivial task (the
   liveness probe, bounded), and the node that runs none is replaced; printed with the probe's part;
4. `--auto-resume-mode=relaunch` (today's path): every rank is killed and started again, and with no checkpoint
   training starts over from step 0 (the steps lost are printed beside it).

The clock starts when the node is marked. The ranks' own lines (`hpr-inprocess joined ... at=<epoch>`) give the
time each was training again.

    PYTHONPATH=. .venv/bin/python bench/bench_inprocess.py [--base-port 21817] [--timeout 300]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.checkpointless import die_outright
from hpresilience.testing.devcluster import DevCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_restart import events, text, wait_for

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "checkpointless" / "train.py"
FAULT_AFTER = 10


def joined(out: str) -> list[dict[str, str]]:
    return [
        dict(kv.split("=", 1) for kv in ln.split()[2:])
        for ln in out.splitlines()
        if ln.startswith("hpr-inprocess joined")
    ]


CASES = {  # name: (--auto-resume-mode, --auto-resume-standby, the fault on n2)
    "cold": ("inprocess", "off", "replace"),
    "standby": ("inprocess", "spares", "replace"),
    "dead": ("inprocess", "spares", "dies"),
    "relaunch": ("relaunch", "spares", "replace"),
}


def run_job(cl: DevCluster, slurm: SlurmClient, work: Path, case: str, timeout: float) -> dict[str, float]:
    mode, standby, fault = CASES[case]
    work.mkdir(parents=True)
    script = work / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"hpresilience srun --auto-resume=1 --auto-resume-state-dir={work}/state --auto-resume-mode={mode} "
        f"--auto-resume-standby={standby} --auto-resume-spares=1 --auto-resume-poll-interval=0.5 "
        f"--ntasks-per-node=2 --overcommit python {TRAIN}\n"
    )
    env = cl.env()
    env.update({"PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}", "TRAIN_STEPS": "100000"})
    # No controller here: the wrapper reads the step's nodes itself, every 0.5 s (a controller's notice would
    # reach it as fast, through its own job's record).
    config = work / "config.yaml"
    config.write_text("autoresume:\n  full_node_check_s: 0.5\n")
    env.update({"STEP_SLEEP": "0.1", "HPR_WORLD_WAIT_S": "120", "HPRESILIENCE_CONFIG": str(config)})
    job = slurm.sbatch("--nodes=3", "--no-kill", f"--output={work}/out", f"--error={work}/err", str(script), env=env)
    out = work / "out"
    try:
        wait_for(lambda: f"step={FAULT_AFTER} " in text(out), f"step {FAULT_AFTER}", timeout)
        before = len(joined(text(out)))
        t0 = time.time()
        if fault == "dies":
            die_outright(cl, "n2", job)  # a node that dies outright: its slurmd and the job's tasks on it
        else:
            slurm.set_node_state(["n2"], "fail", "Action:Replace")
        wait_for(lambda: len(joined(text(out))) >= before + 4, "every rank in the new world", timeout)
        lines = joined(text(out))[before:]
        again = max(float(j["at"]) for j in lines)
        wait_for(lambda: _steps_after(text(out), again), "a step after the recovery", timeout)
        done_before = max(s for s, at in _steps(text(out)) if at < again)
        first_after = _steps_after(text(out), again)[0]
        figures = {
            "training_again_s": again - t0,
            "first_step_after_s": first_after[1] - t0,
            "steps_redone": float(done_before - (first_after[0] - 1)),
        }
        if fault == "dies":
            # Its step's end and the liveness probe (nodes_probed); were the world silent first, the stall watch's.
            probed = (events(work, job, "nodes_probed") or events(work, job, "silent_step_probed"))[0]
            figures["probe_s"] = float(probed["took_s"])
            figures["detect_s"] = float(probed["time"]) - t0  # the probe's answer: n2 runs no task
        elif mode == "inprocess":
            figures["detect_s"] = float(events(work, job, "node_fault_seen")[0]["time"]) - t0
        if mode == "inprocess":
            figures["world_written_s"] = float(events(work, job, "inprocess_world_written")[1]["time"]) - t0
            survivors = [j for j in lines if j["state_from"] == "-"]
            figures["survivors_left_s"] = max(float(j["at"]) - float(j["recovery_s"]) for j in survivors) - t0
            new = [j for j in lines if j["state_from"] != "-"]
            figures["replacement_started_s"] = max(float(j["at"]) - float(j["recovery_s"]) for j in new) - t0
            figures["state_transfer_s"] = max(float(j["recovery_s"]) for j in new)
            figures["group_s"] = max(float(j["group_s"]) for j in new)
        return figures
    finally:
        slurm.cancel(job)
        if fault == "dies":
            cl.start_node("n2")  # nobody marked it: there is nothing to resume
        else:
            slurm.set_node_state(["n2"], "resume")


def _steps(out: str) -> list[tuple[int, float]]:
    return [(int(s), float(at)) for s, at in re.findall(r"^step=(\d+) generation=\d+ at=([\d.]+)", out, re.MULTILINE)]


def _steps_after(out: str, t0: float) -> list[tuple[int, float]]:
    return [(s, at) for s, at in _steps(out) if at > t0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-port", type=int, default=21817)
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-inprocess-") as tmp:
        cl = DevCluster(Path(tmp) / "cluster", 4, args.base_port)
        cl.up(timeout=60)
        try:
            slurm = cl.client()
            results = {}
            for case in CASES:
                wait_for(lambda: all(n.is_idle for n in slurm.nodes()), "an idle cluster", 60)
                results[case] = run_job(cl, slurm, Path(tmp) / case, case, args.timeout)
        finally:
            cl.down()
    rl = results["relaunch"]
    print("fault on a training node -> every rank training again, same job, same run:")
    for case, label, ready in (
        ("cold", "Action:Replace, in-process, cold replacement", "ready (step launch, python, torch, model)"),
        ("standby", "Action:Replace, in-process, warm standby   ", "ready (its assignment seen)"),
        ("dead", "node dies, in-process, warm standby        ", "ready (its assignment seen)"),
    ):
        ip = results[case]
        probe = f", of which the liveness probe {ip['probe_s']:.2f}" if "probe_s" in ip else ""
        print(
            f"  {label}: {ip['training_again_s']:.2f} s  (detect {ip['detect_s']:.2f}{probe}, new world written "
            f"{ip['world_written_s']:.2f}, survivors out of the old group {ip['survivors_left_s']:.2f}, replacement "
            f"{ready} {ip['replacement_started_s']:.2f}, its join + state from a peer "
            f"{ip['state_transfer_s']:.2f} (in the new group after {ip['group_s']:.2f})); "
            f"first step after {ip['first_step_after_s']:.2f} s; "
            f"steps redone {ip['steps_redone']:.0f}"
        )
    print(
        f"  Action:Replace, relaunch path              : {rl['training_again_s']:.2f} s; "
        f"first step after {rl['first_step_after_s']:.2f} s; "
        f"steps redone {rl['steps_redone']:.0f} (no checkpoint: from step 0)"
    )


if __name__ == "__main__":
    main()
