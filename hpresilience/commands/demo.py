"""`hpresilience demo`: the whole story on the embedded local Slurm cluster, as a readable timeline
(the story itself is hpresilience/testing/demo.py)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from hpresilience.commands.context import Ctx, pass_ctx
from hpresilience.commands.devcluster import settings_of
from hpresilience.testing.demo import Story, Timeline, run_story
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.scenarios import SCENARIOS, Scenario, run_scenario


@click.command()
@click.option("--keep", is_flag=True, help="Leave the cluster and its daemons' logs afterwards.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Give up after this many seconds.")
@click.option(
    "--scenario",
    type=click.Choice(sorted(SCENARIOS)),
    default=None,
    help="Run one fault scenario instead of the story; it ends with one line `scenario NAME: ok|FAILED ...`.",
)
@pass_ctx
def demo(c: Ctx, keep: bool, timeout: float, scenario: str | None) -> None:
    """Run the whole story on a local Slurm cluster and print its timeline."""
    dev = settings_of(c)
    state_dir = os.environ.get("HPRESILIENCE_DEVCLUSTER_DIR") or dev.state_dir
    cl = DevCluster(
        state_dir=Path(state_dir),
        nodes=4,
        base_port=dev.base_port,
        # Three times MessageTimeout (10 s), not shorter: the checkpointless scenario kills n3's slurmd, whose port
        # stays open, so each ping round waits MessageTimeout on it, and with less margin slurmctld can set the
        # healthy nodes DOWN with it (docs/slurm-notes.md). The wrapper does not wait for DOWN.
        overrides={"SlurmdTimeout": "30", **dev.overrides},
        bin_dir=c.config.slurm.bin_dir,
    )
    tl = Timeline()
    tl.say(f"starting a real Slurm cluster: slurmctld + 4 slurmd in {cl.state_dir}")
    took = cl.up(progress=tl.say)
    tl.say(f"all 4 nodes idle after {took:.2f} s (export SLURM_CONF={cl.conf_path})")
    work = cl.state_dir / "demo"
    work.mkdir(parents=True, exist_ok=True)
    story = Story(cl, work, tl)
    ok = True
    try:
        if scenario is None:
            run_story(story, tl, timeout)
        else:
            ok, line = run_scenario(scenario, Scenario(cl, work / scenario, tl.say, timeout))
            click.echo(line)
    finally:
        story.stop()
        if keep:
            tl.say(f"left running; logs in {work}; stop with: hpresilience devcluster down --state-dir {cl.state_dir}")
        else:
            stopped = cl.down()
            tl.say(f"cleaned up: agents, controller and {stopped} Slurm processes stopped, {cl.state_dir} removed")
    if not ok:
        raise SystemExit(1)
