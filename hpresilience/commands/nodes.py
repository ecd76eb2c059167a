"""`hpresilience nodes`: the cluster's nodes as Slurm reports them (one query)."""

from __future__ import annotations

import click

from hpresilience.commands.context import Ctx, pass_ctx
from hpresilience.slurm.client import SlurmClient


@click.command()
@click.option("--unavailable", is_flag=True, help="Only nodes that are down, drained, failed or failing.")
@pass_ctx
def nodes(c: Ctx, unavailable: bool) -> None:
    """List nodes with state, address and reason."""
    client = SlurmClient.from_settings(c.config.slurm)
    items = [n for n in client.nodes() if n.is_unavailable or not unavailable]
    data = [{"name": n.name, "state": sorted(n.states), "address": n.address, "reason": n.reason} for n in items]
    text = "\n".join(f"{n.name:10} {n.state_text:24} {n.address:15} {n.reason}" for n in items)
    c.emit(data, text or "(no nodes)")
