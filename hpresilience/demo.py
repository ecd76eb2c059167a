"""`hpresilience demo`: the main job on the embedded local cluster, with a readable timeline.

Brings a real devcluster up, runs a job across every node, takes a node out of service the way
the agent does (`state=fail reason="Action:Replace ..."`), reads the reason back, shrinks a
running job off that node and grows it back with a healthy one, runs a step on the new node
list, and cleans up.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import click

from hpresilience.cli import Ctx, pass_ctx
from hpresilience.slurm.devcluster import DevCluster
from hpresilience.slurm.hostlist import compress


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        click.echo(f"[{time.monotonic() - self.t0:7.2f}s] {text}")


@click.command()
@click.option("--nodes", "-n", type=click.IntRange(3, 16), default=4, show_default=True)
@click.option("--keep", is_flag=True, help="Leave the cluster running afterwards.")
@pass_ctx
def demo(c: Ctx, nodes: int, keep: bool) -> None:
    """Run the main job on a local Slurm cluster and print what happened."""
    state_dir = os.environ.get("HPRESILIENCE_DEVCLUSTER_DIR") or c.config.devcluster.state_dir
    cl = DevCluster(state_dir=Path(state_dir), nodes=nodes, base_port=c.config.devcluster.base_port,
                    overrides=dict(c.config.devcluster.overrides), bin_dir=c.config.slurm.bin_dir)
    tl = Timeline()
    tl.say(f"starting a real Slurm cluster: slurmctld + {nodes} slurmd in {cl.state_dir}")
    took = cl.up(progress=tl.say)
    tl.say(f"all {nodes} nodes idle after {took:.2f} s (export SLURM_CONF={cl.conf_path})")
    client = cl.client()
    try:
        res = client.runner.run("srun", f"-N{nodes}", "--label", "printenv", "SLURMD_NODENAME")
        seen = sorted(line.split(":", 1)[1].strip() for line in res.stdout.splitlines() if ":" in line)
        tl.say(f"srun -N{nodes} ran one task on each node: {', '.join(seen)}")

        with tempfile.TemporaryDirectory(prefix="hpr-demo-") as tmp:
            job_id = client.sbatch("-N2", "--no-kill", f"--output={tmp}/out", "--wrap", "sleep 600")
            job = client.wait_running(job_id)
            tl.say(f"job {job_id} running on {compress(job.nodes)}")
            bad, good = job.nodes[1], job.nodes[0]
            client.set_node_state([bad], "fail", "Action:Replace demo: injected fault")
            node = client.node(bad)
            tl.say(f"node {bad} marked: state={node.state_text} reason={node.reason!r}")
            job = client.shrink_job(job_id, [good])
            tl.say(f"job {job_id} shrunk to {compress(job.nodes)}; {bad} is now {client.node(bad).state_text}")
            spare = next(n.name for n in client.nodes() if n.is_idle and n.name not in job.nodes)
            job = client.grow_job(job_id, 1, nodes=[spare])
            tl.say(f"job {job_id} grown back to {len(job.nodes)} nodes with {spare}: {compress(job.nodes)}")
            res = client.runner.run("srun", f"--jobid={job_id}", f"-N{len(job.nodes)}",
                                    f"--nodelist={compress(job.nodes)}", "--label", "printenv", "SLURMD_NODENAME")
            ran = sorted(line.split(":", 1)[1].strip() for line in res.stdout.splitlines() if ":" in line)
            tl.say(f"step on the new node list ran on: {', '.join(ran)} (job id unchanged: {job_id})")
            client.cancel(job_id)
            client.set_node_state([bad], "resume")
            tl.say(f"node {bad} resumed: {client.node(bad).state_text}")
    finally:
        if not keep:
            stopped = cl.down()
            tl.say(f"cluster stopped ({stopped} processes), {cl.state_dir} removed")
        else:
            tl.say(f"cluster left running: export SLURM_CONF={cl.conf_path}")

