"""`hpresilience check`: run the checks once, print a table (or --json), exit 1 when a check fails.

Usable as Slurm's HealthCheckProgram and in a prolog: the exit status is the verdict, and the run
stays well inside HealthCheckTimeout (60 s by default) with the passive set.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import click

from hpresilience.commands.context import Ctx, pass_ctx
from hpresilience.fileio import locked
from hpresilience.health.api import run_profile
from hpresilience.health.base import CheckResult, Kind
from hpresilience.health.settings import HealthSettings
from hpresilience.log import get_logger

log = get_logger("hpresilience.check")


def _override(settings: HealthSettings, **kw: Any) -> HealthSettings:
    paths = {k: v for k, v in {"sysfs": kw.pop("sysfs"), "procfs": kw.pop("procfs"), "dev": kw.pop("dev")}.items() if v}
    update = {k: v for k, v in kw.items() if v}
    if paths:
        update["path"] = settings.path.model_copy(update=paths)
    return settings.model_copy(update=update)


def render_table(results: list[CheckResult]) -> str:
    rows = [("CHECK", "KIND", "STATUS", "ACTION", "TIME", "REASON")]
    for r in results:
        rows.append(
            (
                r.check,
                r.kind.value,
                r.status.value.replace("not_applicable", "n/a"),
                r.action.value,
                f"{r.duration_s:.2f}s",
                r.reason,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row[:5], widths, strict=True)) + "  " + row[5] for row in rows
    )


@contextmanager
def state_lock(c: Ctx) -> Iterator[None]:
    """The agent's state lock, where this node has an agent: the checks write escalation history and counter
    baselines that the agent daemon writes too. No agent state directory, or not ours to lock: no lock."""
    path = Path(c.config.agent.state_dir) / "state.lock"
    stack = ExitStack()
    if path.parent.is_dir():
        try:
            if not stack.enter_context(locked(path, 40.0)):
                log.warning("check_ran_without_state_lock", lock=str(path), waited_s=40.0)
        except OSError as err:  # a user without rights on root's state directory: the checks still run
            log.debug("check_state_lock_unavailable", lock=str(path), error=str(err))
    with stack:
        yield


@click.command("check")
@click.option("--profile", help="Profile name (default: config health.profile, 'auto' = instance type).")
@click.option(
    "--active/--passive-only",
    default=False,
    help="Also run active checks (stress, DCGM diag, EFA loopback). Only on idle or drained nodes.",
)
@click.option("--check", "only", multiple=True, help="Run only this check (repeatable); ignores the profile's list.")
@click.option("--path.sysfs", "sysfs", help="Root of sysfs (default /sys).")
@click.option("--path.procfs", "procfs", help="Root of procfs (default /proc).")
@click.option("--path.dev", "dev", help="Root of /dev (kmsg, infiniband/uverbs*).")
@click.option("--kernel-log", help="Kernel log to read instead of <path.dev>/kmsg (a file is read as lines).")
@click.option("--nvml", help="NVML source: auto, pynvml, nvidia-smi, or a recorded snapshot JSON path.")
@click.option("--state-dir", help="Where escalation history and counter baselines are kept.")
@click.option(
    "--strict",
    is_flag=True,
    help="No post-boot or driver-change grace: a missing GPU or a broken NVML fails now (health gates).",
)
@pass_ctx
def check(
    c: Ctx,
    profile: str | None,
    active: bool,
    only: tuple[str, ...],
    sysfs: str | None,
    procfs: str | None,
    dev: str | None,
    kernel_log: str | None,
    nvml: str | None,
    state_dir: str | None,
    strict: bool,
) -> None:
    """Run the node's health checks once and print the results."""
    settings = _override(
        c.config.health,
        sysfs=sysfs,
        procfs=procfs,
        dev=dev,
        kernel_log=kernel_log,
        nvml=nvml,
        state_dir=state_dir,
    )
    kinds = (Kind.PASSIVE, Kind.ACTIVE) if active else (Kind.PASSIVE,)
    with state_lock(c):
        prof, results, verdict = run_profile(settings, profile, kinds, list(only) or None, strict)
    data = {
        "profile": prof.name,
        "profile_sources": prof.sources,
        "verdict": verdict.to_dict(),
        "results": [r.to_dict() for r in results],
    }
    text = render_table(results) + (
        f"\n\nprofile {prof.name}: {verdict.status.value.upper()} (action {verdict.action.value}) - {verdict.reason}"
    )
    c.emit(data, text)
    if verdict.exit_code:
        raise click.exceptions.Exit(verdict.exit_code)
