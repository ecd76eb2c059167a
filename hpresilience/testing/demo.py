"""The demo's story (`hpresilience demo`): the whole story on the embedded local Slurm cluster, as a readable timeline.

1. A real Slurm cluster comes up on this machine (slurmctld + 4 slurmd, each node its own address).
2. Each node gets a recorded-hardware root (a p5.48xlarge: 8 GPUs, 32 EFA) and its own agent.
3. The controller starts, repairing through a `script` provider: the devcluster's node replacement
   (fresh hardware, fresh slurmd under the same name), gated by `hpresilience check` on that node.
4. A torch CPU (gloo) training job runs as `srun --auto-resume=1` with one hot spare, checkpointing
   to node memory through hpresilience.torch.
5. An XID 79 (GPU fallen off the bus) is injected into a training node's kernel log.
6. The timeline follows: agent marks the node FAIL, the wrapper swaps in the spare and relaunches the
   step, the controller repairs the node and returns it to service, training finishes with the same
   final step as planned. Measured latencies are printed, and everything is cleaned up.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import yaml

import hpresilience
from hpresilience import proc
from hpresilience.errors import EnvironmentMissing, JobFailed
from hpresilience.goodput.ledgerfile import read_events
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.hostlist import compress
from hpresilience.testing.devcluster import DevCluster

REPO = Path(hpresilience.__file__).resolve().parent.parent
STEPS = 60


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.marks: dict[str, float] = {}

    def now(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str, mark: str | None = None) -> None:
        t = self.now()
        if mark and mark not in self.marks:
            self.marks[mark] = t
        click.echo(f"[{t:7.2f}s] {text}")


class Story:
    def __init__(self, cl: DevCluster, work: Path, tl: Timeline) -> None:
        self.cl, self.work, self.tl = cl, work, tl
        self.client: SlurmClient = cl.client()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.python = sys.executable
        self.env = {**cl.env(), "PYTHONUNBUFFERED": "1"}

    def spawn(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        out = open(self.work / log, "wb")  # noqa: SIM115 - owned by the child for its lifetime
        p = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def hardware(self) -> None:
        from hpresilience.testing.fakenode import FakeNode

        for name in self.cl.names():
            # Configs and agent state live beside the hardware root: a replacement rebuilds the root.
            node = FakeNode.make(self.work / "hw" / name, "p5.48xlarge")
            cfg = yaml.safe_load((node.root / "config.yaml").read_text())
            cfg["logging"] = {"json": True}
            cfg["agent"] = {
                "node_name": name,
                "passive_interval_s": 2.0,
                "metrics_address": "",
                "state_dir": str(self.work / "agent-state" / name),
                "active_checks": False,
            }
            (self.work / f"agent-{name}.yaml").write_text(yaml.safe_dump(cfg))

    def agents(self) -> None:
        for name in self.cl.names():
            self.spawn(
                [self.python, "-m", "hpresilience", "--config", str(self.work / f"agent-{name}.yaml"), "agent"],
                f"agent-{name}.log",
            )

    def controller(self) -> None:
        repair = self.work / "repair.sh"
        repair.write_text(
            "#!/bin/sh\n# The devcluster's repair of node $1: a reboot clears the kernel log and volatile errors,\n"
            "# a replacement brings healthy hardware; either way a fresh slurmd registers under the same name.\n"
            f'set -e\nif [ "$2" = reboot ]; then what=reboot; else what=heal; fi\n'
            f"{shlex.quote(self.python)} -m hpresilience.testing.fakenode $what "
            f"{shlex.quote(str(self.work / 'hw'))}/$1\n"
            f"{shlex.quote(self.python)} -m hpresilience devcluster restart-node $1 "
            f"--state-dir {shlex.quote(str(self.cl.state_dir))}\n"
        )
        repair.chmod(0o755)
        cfg = {
            "logging": {"json": True},
            "controller": {
                "poll_interval_s": 0.5,
                "state_dir": str(self.work / "controller"),
                "forced_down_after_s": 30,
                "metrics_address": "",
                "default_provider": "script",
                "default_options": {"command": [str(repair), "{node}", "{action}"], "timeout_s": 60},
                "gate": {
                    "kind": "command",
                    "timeout_s": 60,
                    "command": [
                        self.python,
                        "-m",
                        "hpresilience",
                        "--config",
                        str(self.work / "agent-{node}.yaml"),
                        "check",
                    ],
                },
            },
        }
        (self.work / "controller.yaml").write_text(yaml.safe_dump(cfg))
        self.spawn(
            [self.python, "-m", "hpresilience", "--config", str(self.work / "controller.yaml"), "controller"],
            "controller.log",
        )

    def submit(self) -> int:
        example = REPO / "examples" / "train_gloo.py"
        if not example.exists():
            raise EnvironmentMissing(f"the example training script is missing: {example}")
        bindir = os.path.dirname(self.python)
        script = self.work / "train.sbatch"
        script.write_text(
            "#!/bin/bash\n"
            f"export PATH={shlex.quote(str(REPO / 'slurm'))}:{shlex.quote(bindir)}:$PATH  # the srun shim first\n"
            f"export HPR_CKPT_DIR={shlex.quote(str(self.work / 'ckpt'))}\n"
            f"srun --auto-resume=1 --auto-resume-spares=1 --auto-resume-state-dir={shlex.quote(str(self.work))} "
            f"-N2 --ntasks-per-node=1 {shlex.quote(self.python)} {shlex.quote(str(example))} "
            f"--steps {STEPS} --ckpt-every 5 --sleep 0.2\n"
        )
        return self.client.sbatch(
            "-N3",
            "--no-kill",
            f"--output={self.work / 'job.out'}",
            f"--error={self.work / 'job.err'}",
            str(script),
            env=self.env,
        )

    def events(self, job_id: int) -> list[dict[str, Any]]:
        path = self.work / f"{job_id}.events.jsonl"
        return read_events(path) if path.exists() else []

    def last_step(self) -> int:
        text = (self.work / "job.out").read_text(errors="replace") if (self.work / "job.out").exists() else ""
        steps = [
            int(w.split("=")[1])
            for line in text.splitlines()
            for w in line.split()
            if w.startswith("step=") and w.split("=")[1].isdigit()
        ]
        return max(steps, default=0)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill_group(p.pid)  # started in a session of its own: its helpers go with it
                p.wait()


def run_story(story: Story, tl: Timeline, timeout: float) -> None:
    client = story.client
    story.hardware()
    story.agents()
    tl.say("4 agents started, one per node, each on its own recorded p5.48xlarge hardware (8 GPUs, 32 EFA)")
    story.controller()
    tl.say("controller started (provider: script = devcluster node replacement; gate: hpresilience check)")
    job_id = story.submit()
    tl.say(
        f"submitted job {job_id}: 3 nodes, `srun --auto-resume=1 --auto-resume-spares=1 -N2` train_gloo.py "
        f"({STEPS} steps, checkpoint every 5 to node memory)"
    )
    deadline = time.monotonic() + timeout
    seen: set[int] = set()

    def pump_events() -> list[dict[str, Any]]:
        evs = story.events(job_id)
        for i, e in enumerate(evs):
            if i in seen:
                continue
            seen.add(i)
            name = e.get("event")
            if name == "attempt_started":
                tl.say(
                    f"wrapper: attempt {e.get('attempt')} on {e.get('nodes')} MASTER_ADDR={e.get('master_addr')} "
                    f"MASTER_PORT={e.get('master_port')}",
                    f"attempt{e.get('attempt')}",
                )
            elif name in (
                "node_fault_seen",
                "node_swapped",
                "allocation_shrunk",
                "step_relaunching",
                "rule_fired",
                "no_replacement",
                "job_step_given_up",
            ):
                detail = {k: v for k, v in e.items() if k not in ("event", "job_id", "time")}
                tl.say(f"wrapper: {name} {detail}", name)
            elif name == "step_running" and e.get("restart_latency_s") is not None:
                tl.say(
                    f"wrapper: relaunched step running, restart latency {e['restart_latency_s']:.2f} s", "relaunched"
                )
        return evs

    while story.last_step() < 10:
        pump_events()
        job = client.job(job_id)
        if job.is_finished:
            raise JobFailed(f"job {job_id} ended early ({job.state}); see {story.work}/job.err")
        if time.monotonic() > deadline:
            raise JobFailed(f"training did not reach step 10 within {timeout:g} s; see {story.work}")
        time.sleep(0.2)
    step_nodes = next(e["nodes"].split(",") for e in reversed(pump_events()) if e.get("event") == "attempt_started")
    job = client.job(job_id)
    victim = next((n for n in step_nodes if n != job.batch_host), step_nodes[-1])
    tl.say(f"training at step {story.last_step()} on {compress(step_nodes)} (batch host {job.batch_host})")
    from hpresilience.testing.fakenode import FakeNode

    FakeNode(story.work / "hw" / victim).inject("xid:79:0")
    tl.say(f"FAULT INJECTED: `NVRM: Xid ... 79` (GPU has fallen off the bus) in {victim}'s kernel log", "inject")
    last_state = ""
    while time.monotonic() < deadline:
        pump_events()
        node = client.node(victim)
        state = f"{node.state_text} {node.reason!r}"
        if state != last_state:
            mark = (
                "failed"
                if node.has("FAIL") and "[hpr-agent]" in node.reason
                else "repairing"
                if "[hpr-controller]" in node.reason
                else "back"
                if node.is_idle and "failed" in tl.marks
                else None
            )
            tl.say(f"slurm: {victim} is {node.state_text}" + (f" reason={node.reason!r}" if node.reason else ""), mark)
            last_state = state
        # The job is read only once the node is back: until then each poll reads the node alone, so the
        # short window in which the marked node is still in the job (allocated+fail) is not polled past.
        if "back" in tl.marks:
            job = client.job(job_id)
            if job.is_finished:
                break
        time.sleep(0.2)
    else:
        raise JobFailed(f"the story did not finish within {timeout:g} s; logs in {story.work}")
    pump_events()
    out = (story.work / "job.out").read_text(errors="replace")
    finished = [line for line in out.splitlines() if "training finished" in line]
    if job.state != "COMPLETED" or not finished:
        raise JobFailed(f"job {job_id} ended {job.state} without finishing training; see {story.work}/job.err")
    tl.say(
        f"job {job_id} {job.state}: {finished[-1].strip()} (planned {STEPS} steps; same job id throughout)", "finished"
    )
    m = tl.marks
    click.echo("\nmeasured latencies")
    for label, a, b in (
        ("fault injected -> node FAIL in Slurm (agent)", "inject", "failed"),
        ("fault injected -> step relaunched and running (wrapper)", "inject", "relaunched"),
        ("node FAIL -> repaired and back idle (controller)", "failed", "back"),
        ("fault injected -> training finished", "inject", "finished"),
    ):
        if a in m and b in m:
            click.echo(f"  {label:58} {m[b] - m[a]:6.2f} s")
