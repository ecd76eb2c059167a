"""`hpresilience agent`: the node daemon (systemd), or one pass with --once (HealthCheckProgram)."""

from __future__ import annotations

import signal
from typing import Any

import click

from hpresilience.commands.context import Ctx, pass_ctx


@click.command("agent")
@click.option("--once", is_flag=True, help="One cycle (checks, decision, action), then exit: for HealthCheckProgram.")
@click.option("--dry-run", is_flag=True, help="The same as --mode observe.")
@click.option(
    "--mode",
    type=click.Choice(["observe", "enforce"]),
    help="observe: log and count what would be done, never touch Slurm (default: config agent.mode).",
)
@click.option("--node", "node_name", help="Slurm node name (default: config agent.node_name, $SLURMD_NODENAME, host).")
@click.option("--profile", help="Health profile (default: config health.profile).")
@click.option("--interval", type=float, help="Seconds between passive cycles (default: agent.passive_interval_s).")
@click.option("--metrics-address", help="HOST:PORT for /metrics and /healthz; '' disables.")
@click.option("--path.sysfs", "sysfs", help="Root of sysfs (default /sys).")
@click.option("--path.procfs", "procfs", help="Root of procfs (default /proc).")
@click.option("--path.dev", "dev", help="Root of /dev.")
@pass_ctx
def agent(
    c: Ctx,
    once: bool,
    dry_run: bool,
    mode: str | None,
    node_name: str | None,
    profile: str | None,
    interval: float | None,
    metrics_address: str | None,
    sysfs: str | None,
    procfs: str | None,
    dev: str | None,
) -> None:
    """Run health checks on this node and mark it in Slurm when a fault is confirmed."""
    from hpresilience.agent.collector import HealthCollector
    from hpresilience.agent.daemon import Agent
    from hpresilience.fileio import require_writable_dir
    from hpresilience.health.base import Mode
    from hpresilience.metrics import start_metrics_server
    from hpresilience.slurm.client import SlurmClient

    cfg = c.config
    update: dict[str, Any] = {}
    if dry_run:
        update["dry_run"] = True
    if mode:
        update["mode"] = Mode(mode)
    if node_name:
        update["node_name"] = node_name
    if interval:
        update["passive_interval_s"] = interval
    if metrics_address is not None:
        update["metrics_address"] = metrics_address
    settings = cfg.agent.model_copy(update=update)
    paths = {k: v for k, v in {"sysfs": sysfs, "procfs": procfs, "dev": dev}.items() if v}
    health = cfg.health.model_copy(update={"path": cfg.health.path.model_copy(update=paths)}) if paths else cfg.health
    # What must survive a restart (repeat streaks, XID escalation, counter baselines): refuse to start without it.
    require_writable_dir(settings.state_dir, "agent.state_dir")
    require_writable_dir(health.state_dir, "health.state_dir")
    collector = HealthCollector(health, profile, sources=[] if once else None)
    # Slurm kills a HealthCheckProgram after HealthCheckTimeout (60 s by default): a --once run waits for the
    # daemon's cycle in flight at most 40 s, then skips (the daemon's cycle is checking this node anyway).
    daemon = Agent(settings, SlurmClient.from_settings(cfg.slurm), collector, lock_wait_s=40.0 if once else None)
    if once:
        d = daemon.cycle()
        c.emit(
            {"node": daemon.node_name, "decision": d.kind.value, "why": d.why, "reason": d.reason},
            f"{daemon.node_name}: {d.kind.value} ({d.why}){' -> ' + d.reason if d.reason else ''}",
        )
        return
    server = None
    if settings.metrics_address:
        server = start_metrics_server(daemon.registry, settings.metrics_address, daemon.healthy, "agent")

    def stop(signum: int, _frame: object) -> None:
        daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        daemon.run()
    finally:
        collector.close()
        if server is not None:
            server.stop()
