"""`hpresilience controller [run] [--once] [--dry-run]`, `hpresilience replace NODE`, `hpresilience status`."""

from __future__ import annotations

import getpass
import signal
import time
from types import FrameType
from typing import Any

import click

from hpresilience.commands.context import Ctx, pass_ctx
from hpresilience.controller.settings import ControllerSettings
from hpresilience.controller.state import FOR_A_PERSON, StateStore
from hpresilience.errors import ConfigError, HPResilienceError
from hpresilience.log import printable
from hpresilience.reasons import Action, parse_reason
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.features import SlurmFeatures


def _settings(c: Ctx, state_dir: str | None = None, dry_run: bool = False) -> ControllerSettings:
    s = c.config.controller
    changes: dict[str, Any] = {}
    if state_dir:
        changes["state_dir"] = state_dir
    if dry_run:
        changes["dry_run"] = True
    return s.model_copy(update=changes) if changes else s


state_dir_opt = click.option("--state-dir", help="The controller's state directory (default: from the config).")


@click.group(invoke_without_command=True)
@click.option("--once", is_flag=True, help="One cycle (and record what it started), then exit.")
@click.option("--dry-run", is_flag=True, help="Log every decision, change nothing.")
@state_dir_opt
@click.pass_context
def controller(ctx: click.Context, once: bool, dry_run: bool, state_dir: str | None) -> None:
    """The head-node repair daemon: watches node reasons and repairs nodes through a provider."""
    if ctx.invoked_subcommand is None:
        _run(ctx.find_object(Ctx), once, dry_run, state_dir)


@controller.command("run")
@click.option("--once", is_flag=True, help="One cycle (and record what it started), then exit.")
@click.option("--dry-run", is_flag=True, help="Log every decision, change nothing.")
@state_dir_opt
@pass_ctx
def run_cmd(c: Ctx, once: bool, dry_run: bool, state_dir: str | None) -> None:
    """Run the daemon (the same as plain `hpresilience controller`)."""
    _run(c, once, dry_run, state_dir)


def _run(c: Ctx | None, once: bool, dry_run: bool, state_dir: str | None) -> None:
    from hpresilience.controller.loop import Controller
    from hpresilience.controller.preflight import preflight
    from hpresilience.fileio import require_writable_dir
    from hpresilience.log import get_logger
    from hpresilience.metrics import start_metrics_server

    log = get_logger("hpresilience.controller")

    assert c is not None
    settings = _settings(c, state_dir, dry_run)
    client = SlurmClient.from_settings(c.config.slurm)
    if not settings.dry_run:
        require_writable_dir(settings.state_dir, "controller.state_dir")
    ctl = Controller(settings, client)
    problems = preflight(settings, client)
    if problems and not settings.dry_run:
        raise ConfigError("controller cannot work on this cluster: " + "; ".join(problems))
    for problem in problems:  # a dry run previews decisions all the same
        log.warning("controller_preflight_failed", problem=problem, dry_run=True)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        ctl.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = None
    if settings.metrics_address and not once:
        from hpresilience.goodput.ledgermetrics import LedgerCollector

        # Jobs' goodput from their ledgers, labelled as Slurm reports the job (docs/goodput.md).
        ctl.registry.register(LedgerCollector(ctl.client, c.config.autoresume.state_dir))
        server = start_metrics_server(ctl.registry, settings.metrics_address, ctl.healthy, "controller")
    try:
        ctl.run(once=once)
    finally:
        if server is not None:
            server.stop()


@click.command()
@click.argument("node")
@click.option("--reboot", is_flag=True, help="Ask for a reboot instead of a replacement.")
@click.option(
    "--force",
    is_flag=True,
    help="Take the node DOWN now (its jobs lose it at once) and override a reason someone else set.",
)
@pass_ctx
def replace(c: Ctx, node: str, reboot: bool, force: bool) -> None:
    """Ask the controller to replace (or reboot) NODE: sets the Action: reason, the controller does the rest."""
    client = SlurmClient.from_settings(c.config.slurm)
    n = client.node(node)
    store = StateStore(c.config.controller.state_dir)
    under_repair = store.load_all(quarantine=False).get(node)
    if not force:
        if under_repair is not None and under_repair.step not in FOR_A_PERSON:
            raise ConfigError(f"{node} is already under repair (step {under_repair.step}); --force to ask again")
        parsed = parse_reason(n.reason)
        if n.is_unavailable and n.reason and parsed.owner is None and parsed.action is None:
            raise ConfigError(
                f"{node} is out of service with someone else's reason ({n.reason!r}); --force to override it"
            )
        if n.is_busy:
            click.echo(
                f"{node} runs jobs: it is set FAIL now and forced DOWN after "
                f"{c.config.controller.forced_down_after_s:g} s if they have not ended",
                err=True,
            )
    action = Action.REBOOT if reboot else Action.REPLACE
    reason = f"Action:{action.reason_word} requested by {_user()} with hpresilience replace"
    client.set_node_state([node], "down" if force else "fail", reason)
    c.emit(
        {"node": node, "action": action.value, "state": "down" if force else "fail", "reason": reason},
        f"{node}: {'down' if force else 'fail'} with reason {reason!r}; the controller takes it from here",
    )


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _ago(t: float | None) -> str:
    if not t:
        return "-"
    s = max(0.0, time.time() - t)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"


def _features_line(data: dict[str, Any]) -> str:
    """`slurm 26.05.5: expedited_requeue, reboot_force, ...` from what the controller probed at its start."""
    features = SlurmFeatures.from_json(data)
    return f"slurm {printable(features.version) or '?'}: " + (", ".join(features.names()) or "no features of its own")


@click.command()
@click.option(
    "--history", "history_lines", type=int, default=5, show_default=True, help="Also show this many finished repairs."
)
@state_dir_opt
@pass_ctx
def status(c: Ctx, history_lines: int, state_dir: str | None) -> None:
    """Nodes under repair: their step, since when, and the last health result (from the state directory)."""
    store = StateStore(state_dir or c.config.controller.state_dir)
    if not any((store.dir / name).exists() for name in ("controller.lock", "nodes", "history.jsonl")):
        # "No node under repair" would be a claim about the cluster; all we know is that there is no record.
        raise HPResilienceError(
            f"no controller state in {store.dir}: the controller has not run with this state "
            "directory (it runs on the head node: `systemctl status hpresilience-controller`; "
            "or pass --state-dir / set controller.state_dir)"
        )
    records = store.load_all(quarantine=False)
    history = store.history(history_lines) if history_lines > 0 else []
    features = store.features()
    data = {"under_repair": [r.to_json() for r in records.values()], "history": history, "slurm_features": features}
    lines = [_features_line(features)] if features is not None else []
    lines += [f"{'NODE':12} {'STEP':13} {'SINCE':10} {'ACTION':8} {'TRY':>3}  LAST HEALTH / WHY"]
    for r in records.values():
        health = r.last_health or {}
        h = ("pass" if health.get("passed") else "fail") + f" {_ago(health.get('at'))}" if health else "-"
        lines.append(f"{r.node:12} {r.step:13} {_ago(r.step_since):10} {r.current:8} {r.attempt:>3}  {h}; {r.why}")
    if not records:
        lines.append("(no node under repair)")
    if history:
        lines.append("recent:")
        lines += [
            f"  {h.get('node', '?'):12} {h.get('outcome', '?'):28} {_ago(h.get('at'))}  {h.get('why', '')}"
            for h in history
        ]
    c.emit(data, "\n".join(lines))
