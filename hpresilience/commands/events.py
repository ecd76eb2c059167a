"""`hpresilience events [--node N] [--since T] [--json]`: what the agents and the controller decided, on the head
node, from the controller's event record (controller/events.py)."""

from __future__ import annotations

import re
import time
from datetime import datetime

import click

from hpresilience.commands.context import Ctx, pass_ctx
from hpresilience.controller.events import EventLog
from hpresilience.errors import ConfigError, HPResilienceError
from hpresilience.log import printable

_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """`30m`, `2h`, `7d` (that long ago), an ISO time (`2026-11-25T16:00`, local unless it has an offset), or
    epoch seconds."""
    t = text.strip()
    m = _AGO.match(t.lower())
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNIT_S[m.group(2)]
    if re.fullmatch(r"\d{9,11}(\.\d+)?", t):
        return float(t)
    try:
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        raise ConfigError(
            f"--since {text!r}: expected a duration (30m, 2h, 7d), an ISO time (2026-11-25T16:00) or epoch seconds"
        ) from None


@click.command()
@click.option("--node", help="Only this node's events.")
@click.option("--since", help="From this time on: a duration ago (30m, 2h, 7d), an ISO time, or epoch seconds.")
@click.option("--state-dir", help="The controller's state directory (default: from the config).")
@pass_ctx
def events(c: Ctx, node: str | None, since: str | None, state_dir: str | None) -> None:
    """Every mark, hold, repair step, gate result and resume the controller saw or made, oldest first."""
    start = parse_since(since) if since else None
    log = EventLog(state_dir or c.config.controller.state_dir)
    if not log.path.exists() and not log.path.with_name(log.path.name + ".1").exists():
        raise HPResilienceError(
            f"no event record in {log.path.parent}: the controller has not run with this state "
            "directory (events are kept on the head node, where it runs; or pass --state-dir)"
        )
    found = log.read(node, start)
    # A node's reason and a job's text can be users' (Slurm reasons, job names): escaped, one line per event.
    lines = [
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['at']))}  {printable(e.get('node', '?')):12} "
        f"{printable(e.get('kind', '?')):26} by {printable(e.get('by', '?')):24} {printable(e.get('why', ''))}"
        for e in found
    ]
    c.emit(found, "\n".join(lines) or "(no events)")
