"""`hpresilience devcluster up|down|status|env|exec|kill-node|start-node|restart-node|partition|heal|slow`.

A cluster of a newer Slurm release runs inside its Debian root: every command on it re-runs itself there
(the host's 22.05 clients cannot talk to a newer slurmctld).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import psutil

from hpresilience.commands.context import Ctx, pass_ctx
from hpresilience.config import resolve_config_path
from hpresilience.errors import ConfigError
from hpresilience.testing import netns, netshape, nodecpu, slurmroot
from hpresilience.testing.devaccounting import describe
from hpresilience.testing.devcluster import EXTRA_NODE_PREFIX, DevCluster
from hpresilience.testing.devprocs import pidfile_pid
from hpresilience.testing.netns import Isolation
from hpresilience.testing.settings import DevclusterSettings, devcluster_settings
from hpresilience.testing.slurmroot import SlurmRelease

RELEASES = [r.value for r in SlurmRelease]


def settings_of(c: Ctx) -> DevclusterSettings:
    """The configuration's `devcluster:` section, validated here: only what starts a devcluster composes it."""
    return devcluster_settings(c.config.devcluster, str(resolve_config_path(c.config_path) or "<config>"))


def cluster_from(
    c: Ctx,
    nodes: int | None = None,
    state_dir: str | None = None,
    overrides: tuple[str, ...] = (),
    accounting: bool | None = None,
    extra_nodes: int | None = None,
    proctrack: str | None = None,
    slurm: str | None = None,
    isolation: str | None = None,
    backup_controller: bool = False,
) -> DevCluster:
    s = settings_of(c)
    extra = dict(s.overrides)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--set")
        extra[key] = value
    where = Path(state_dir or os.environ.get("HPRESILIENCE_DEVCLUSTER_DIR") or s.state_dir)
    port, count = recorded_shape(where)
    return DevCluster(
        state_dir=where,
        nodes=nodes or count or s.nodes,
        base_port=port or s.base_port,
        overrides=extra,
        bin_dir=c.config.slurm.bin_dir,
        accounting=s.accounting if accounting is None else accounting,
        extra_nodes=s.extra_nodes if extra_nodes is None else extra_nodes,
        proctrack=proctrack or s.proctrack,
        slurm=SlurmRelease.parse(slurm) if slurm else None,
        isolation=Isolation.parse(isolation) if isolation else None,
        backup_controller=backup_controller,
    )


def recorded_shape(state_dir: Path) -> tuple[int | None, int | None]:
    """(base port, node count) of the cluster already in this state directory, read from its slurm.conf: commands on
    a running cluster find its ports, nodes and namespaces whatever the configuration says now."""
    try:
        text = (state_dir / "slurm.conf").read_text(errors="replace")
    except OSError:
        return None, None
    port, nodes = None, 0
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SlurmctldPort" and value.strip().isdigit():
            port = int(value.strip())
        elif line.startswith("NodeName=n") and not line.startswith(f"NodeName={EXTRA_NODE_PREFIX}"):
            nodes += 1
    return port, nodes or None


def in_its_root(cl: DevCluster) -> None:
    """Re-run this very command inside the cluster's Slurm root when it has one and this is the host."""
    if cl.needs_root_entry():
        cl.state_dir.mkdir(parents=True, exist_ok=True)  # bound into the root: must exist first
        argv = [sys.executable, "-m", "hpresilience", *sys.argv[1:]]
        slurmroot.exec_in(cl.release, argv, binds=[str(cl.state_dir)], session=root_session(cl))


def root_session(cl: DevCluster) -> int | None:
    """A netns cluster in a root: its live slurmctld, whose mount namespace holds the cluster's namespaces. Only a
    root-owned slurmctld: the command joins that process's mount namespace and root as root, and the marker in an
    environment (or a recycled pid) is anyone's to set."""
    pid = pidfile_pid(cl.state_dir / "slurmctld.pid", str(cl.state_dir)) if cl.netns else None
    try:
        p = psutil.Process(pid) if pid is not None else None
        return pid if p is not None and p.uids().real == 0 and p.name() == "slurmctld" else None
    except psutil.Error:
        return None


state_dir_opt = click.option(
    "--state-dir",
    envvar="HPRESILIENCE_DEVCLUSTER_DIR",
    help="Directory for the cluster's config, logs and state (default .devcluster).",
)
slurm_opt = click.option(
    "--slurm",
    type=click.Choice(RELEASES),
    envvar="HPRESILIENCE_DEVCLUSTER_SLURM",
    help="Slurm release: 22.05 is the host's packages (default); 24.11 and 26.05 run from a "
    "Debian root (trixie, sid) built on first use and cached in "
    "/var/cache/hpresilience/roots.",
)


@click.group()
def devcluster() -> None:
    """A real Slurm cluster (slurmctld + N slurmd) on this machine, for tests and demos."""


@devcluster.command()
@click.option("--nodes", "-n", type=click.IntRange(1, 64), help="Number of nodes (default 4).")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="slurm.conf override, e.g. --set SlurmdTimeout=60 (repeatable).",
)
@click.option(
    "--timeout", type=click.FloatRange(1, 3600), default=30.0, show_default=True, help="Seconds to wait for all-idle."
)
@click.option(
    "--accounting/--no-accounting",
    default=None,
    help="Run MariaDB + slurmdbd (default: when their packages are installed).",
)
@click.option(
    "--extra-nodes",
    type=click.IntRange(0, 100_000),
    default=None,
    help="Add N powered-down p5 nodes (State=CLOUD, partition p5) for a production-size node table.",
)
@click.option(
    "--proctrack",
    type=click.Choice(["auto", "cgroup", "pgid"]),
    default=None,
    help="Process tracking (auto: cgroup v1 where mounted, as real clusters; else pgid).",
)
@click.option(
    "--isolation",
    type=click.Choice([i.value for i in Isolation]),
    default=None,
    help="none (default): nodes share the host's network and processes; netns: each node in its own "
    "network and PID namespace, on a private bridge (for partition/heal/slow).",
)
@click.option(
    "--backup-controller",
    is_flag=True,
    help="With --isolation netns: a backup slurmctld on a host of its own (SlurmctldHost ctl1, ctl2); "
    "`devcluster kill-controller` crashes the primary. Needs --no-accounting for now.",
)
@slurm_opt
@state_dir_opt
@pass_ctx
def up(
    c: Ctx,
    nodes: int | None,
    overrides: tuple[str, ...],
    timeout: float,
    accounting: bool | None,
    extra_nodes: int | None,
    proctrack: str | None,
    isolation: str | None,
    backup_controller: bool,
    slurm: str | None,
    state_dir: str | None,
) -> None:
    """Start the cluster (idempotent); return when every node is idle."""
    cl = cluster_from(
        c, nodes, state_dir, overrides, accounting, extra_nodes, proctrack, slurm, isolation, backup_controller
    )
    if cl.needs_root_entry():
        slurmroot.ensure(cl.release, progress=lambda msg: click.echo(msg, err=True))
        in_its_root(cl)
    took = cl.up(timeout=timeout, progress=lambda msg: click.echo(msg, err=True))
    acct = "with accounting (slurmdbd)" if cl.accounting_wanted() else "without accounting"
    extra = f" + {cl.extra_nodes} powered-down nodes" if cl.extra_nodes else ""
    c.emit(
        {
            "slurm": cl.release.value,
            "isolation": cl.isolation.value,
            "nodes": cl.names(),
            "extra_nodes": cl.extra_nodes,
            "accounting": cl.accounting_wanted(),
            "proctrack": cl.resolved_proctrack(),
            "seconds": round(took, 3),
            "slurm_conf": str(cl.conf_path),
        },
        f"devcluster up: Slurm {cl.release.value}, {cl.nodes} nodes{extra} idle in {took:.2f} s, {acct}, "
        f"proctrack/{cl.resolved_proctrack()}\nexport SLURM_CONF={cl.conf_path}",
    )


@devcluster.command()
@state_dir_opt
@pass_ctx
def down(c: Ctx, state_dir: str | None) -> None:
    """Stop every process the cluster started and remove its directory."""
    cl = cluster_from(c, state_dir=state_dir)
    in_its_root(cl)
    stopped = cl.down()
    c.emit({"stopped": stopped}, f"devcluster down: stopped {stopped} process(es), removed {cl.state_dir}")


@devcluster.command()
@state_dir_opt
@pass_ctx
def status(c: Ctx, state_dir: str | None) -> None:
    """Show the daemons and each node's state; exit 1 when the cluster is not up."""
    cl = cluster_from(c, state_dir=state_dir)
    in_its_root(cl)
    if not cl.conf_path.exists():
        c.emit({"up": False}, f"devcluster: not up ({cl.state_dir} has no slurm.conf)")
        raise click.exceptions.Exit(1)
    pids = cl.daemon_pids()
    nodes = cl.client(timeout=5, retries=0).nodes(cl.names()) if "slurmctld" in pids else []
    data = {
        "up": cl.is_up(),
        "slurm_conf": str(cl.conf_path),
        "pids": pids,
        "accounting": cl.accounting_wanted(),
        "nodes": {n.name: {"state": n.state_text, "address": n.address, "reason": n.reason} for n in nodes},
    }
    lines = [f"slurm_conf: {cl.conf_path}", f"slurmctld: {pids.get('slurmctld', 'not running')}"]
    lines += describe(pids, cl.accounting_wanted())
    lines += [
        f"{n.name:6} {n.address:12} slurmd={pids.get(n.name, '-')!s:8} {n.state_text:20} {n.reason}" for n in nodes
    ]
    c.emit(data, "\n".join(lines))
    if not cl.is_up():
        raise click.exceptions.Exit(1)


@devcluster.command("env")
@state_dir_opt
@pass_ctx
def env_cmd(c: Ctx, state_dir: str | None) -> None:
    """Print the export line for this cluster's SLURM_CONF (eval "$(hpresilience devcluster env)"); a netns cluster
    has none to give: its addresses exist only inside its namespaces (use `devcluster exec`)."""
    cl = cluster_from(c, state_dir=state_dir)
    if cl.netns:
        # From the host's namespace the controller's address is routed off this machine (or, with the guard that
        # `up` adds, nowhere): a SLURM_CONF handed out here could only send the cluster's traffic out of the host.
        raise ConfigError(
            f"the cluster in {cl.state_dir} runs its nodes as separate hosts (--isolation netns): its controller "
            f"{netns.CTL_ADDR} exists only inside its namespaces, so no SLURM_CONF works from this shell; run "
            f"Slurm's commands there: hpresilience devcluster exec -- sinfo"
        )
    c.emit({"SLURM_CONF": str(cl.conf_path)}, f"export SLURM_CONF={cl.conf_path}")


@devcluster.command("kill-node")
@click.argument("name")
@state_dir_opt
@pass_ctx
def kill_node(c: Ctx, name: str, state_dir: str | None) -> None:
    """Kill one node's slurmd (simulates a crashed node)."""
    cl = cluster_from(c, state_dir=state_dir)
    in_its_root(cl)
    if not cl.kill_node(name):
        raise click.ClickException(f"no running slurmd for node {name!r}")
    click.echo(f"killed slurmd of {name}")


@devcluster.command("restart-node")
@click.argument("name")
@click.option("--reboot", is_flag=True, help="Report the node rebooted (slurmd -b): a RebootProgram's reboot.")
@state_dir_opt
@pass_ctx
def restart_node(c: Ctx, name: str, reboot: bool, state_dir: str | None) -> None:
    """Restart one node's slurmd (the devcluster's 'replace' of a node)."""
    cl = cluster_from(c, state_dir=state_dir)
    in_its_root(cl)
    if name not in cl.names():
        raise click.BadParameter(f"unknown node {name!r}; known: {', '.join(cl.names())}", param_hint="NAME")
    cl.restart_node(name, booted=reboot)
    click.echo(f"restarted slurmd of {name}")


@devcluster.command("exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@slurm_opt
@state_dir_opt
@pass_ctx
def exec_cmd(c: Ctx, argv: tuple[str, ...], slurm: str | None, state_dir: str | None) -> None:
    """Run a command in the cluster's environment: inside its Slurm root where it has one, with SLURM_CONF set
    (e.g. `hpresilience devcluster exec -- sinfo -V`). The project and its virtualenv are usable there."""
    cl = cluster_from(c, state_dir=state_dir, slurm=slurm)
    env = dict(os.environ)
    if cl.conf_path.exists():
        env["SLURM_CONF"] = str(cl.conf_path)
    binds = [str(cl.state_dir)] if cl.state_dir.exists() else []
    if cl.needs_root_entry():
        slurmroot.ensure(cl.release, progress=lambda msg: click.echo(msg, err=True))
        binds.append(str(Path.cwd()))
    slurmroot.exec_in(cl.release, [*cl.command_prefix(), *argv], env=env, binds=binds, session=root_session(cl))


def _node_cluster(c: Ctx, name: str, state_dir: str | None) -> DevCluster:
    cl = cluster_from(c, state_dir=state_dir)
    in_its_root(cl)
    return cl


@devcluster.command()
@click.argument("name")
@state_dir_opt
@pass_ctx
def partition(c: Ctx, name: str, state_dir: str | None) -> None:
    """Cut node NAME off the cluster's network (its link goes down; its processes keep running)."""
    _node_cluster(c, name, state_dir).partition(name)
    click.echo(f"partitioned {name}: its link is down")


@devcluster.command("kill-controller")
@state_dir_opt
@pass_ctx
def kill_controller(c: Ctx, state_dir: str | None) -> None:
    """SIGKILL the primary slurmctld (a crashed head node; a backup, if any, takes over)."""
    pid = cluster_from(c, state_dir=state_dir).kill_primary_controller()
    if pid is None:
        raise click.ClickException(
            "no primary slurmctld of this cluster runs in its controller namespace (needs --isolation netns)"
        )
    click.echo(f"killed the primary slurmctld (pid {pid})")


@devcluster.command()
@click.argument("name")
@state_dir_opt
@pass_ctx
def heal(c: Ctx, name: str, state_dir: str | None) -> None:
    """Bring node NAME's link back up."""
    _node_cluster(c, name, state_dir).heal(name)
    click.echo(f"healed {name}: its link is up")


@devcluster.command()
@click.argument("name")
@click.option(
    "--delay-ms",
    type=click.IntRange(0, 60_000),
    help="Netns clusters: delay every packet to and from the node, each way (netem, a kernel module many kernels "
    "lack: the error says so); 0 removes it.",
)
@click.option(
    "--rate",
    help="Netns clusters: cap the node's link at RATE each way (tbf: 1mbit, 500kbit, 2gbit); 0 removes it.",
)
@click.option(
    "--cpu",
    type=float,
    help="Give the node FRACTION of one CPU, its slurmd and all it runs (a quota on its cpu cgroup, v1 or v2); "
    "1 removes it.",
)
@state_dir_opt
@pass_ctx
def slow(c: Ctx, name: str, delay_ms: int | None, rate: str | None, cpu: float | None, state_dir: str | None) -> None:
    """Slow node NAME down: its link (--delay-ms, --rate) or its CPU (--cpu)."""
    if delay_ms is None and rate is None and cpu is None:
        raise click.UsageError("say how: --delay-ms N, --rate R or --cpu FRACTION")
    bps = None if rate is None else netshape.parse_rate(rate)
    if cpu is not None:
        nodecpu.check_fraction(cpu)
    _node_cluster(c, name, state_dir).slow(name, delay_ms, bps=bps, cpu=cpu)
    if delay_ms is not None:
        click.echo(f"{name}: link delay {delay_ms} ms each way" if delay_ms else f"{name}: link delay removed")
    if bps is not None:
        click.echo(f"{name}: link capped at {rate} each way" if bps else f"{name}: link rate cap removed")
    if cpu is not None:
        click.echo(f"{name}: {cpu:g} of one CPU" if cpu < 1 else f"{name}: CPU quota removed")
