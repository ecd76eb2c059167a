"""`hpresilience srun [OPTIONS] [SRUN_ARGS]... CMD [ARGS]...`: srun with --auto-resume, inside a job.

The slurm/srun shim execs this with `--auto-resume=1` removed. Every option srun knows passes through;
the wrapper's own options start with `--auto-resume-` (or are hyperpodrun's --pre/--post-train-script)
and may appear anywhere before the command.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import click

from hpresilience.autoresume.launch.srunargs import SrunArgs, parse_srun_args
from hpresilience.autoresume.optiontable import SRUN_OPTIONS, Kind, SrunOption, merge_scanned, scan_names
from hpresilience.commands.context import Ctx, pass_ctx

F = TypeVar("F", bound=Callable[..., Any])


def _click_type(o: SrunOption) -> click.ParamType[Any, Any] | None:
    if o.kind is Kind.INT:
        return click.IntRange(None if o.low is None else int(o.low), None if o.high is None else int(o.high))
    if o.kind is Kind.FLOAT:
        return click.FloatRange(o.low, o.high, min_open=o.low_open)
    if o.kind is Kind.CHOICE:
        return click.Choice(list(o.choices))
    if o.kind is Kind.FILE:
        return click.Path(dir_okay=False)
    return None


def _table_options(f: F) -> F:
    """One click option per row of autoresume/optiontable.py, in the table's order (also in --help)."""
    for o in reversed(SRUN_OPTIONS):
        if o.kind is Kind.FLAG:
            f = click.option(f"{o.spelled}/--{o.off}", o.dest, default=None, help=o.help)(f)
        else:
            f = click.option(
                o.spelled,
                o.dest,
                type=_click_type(o),
                default=o.default,
                show_default=o.default is not None,
                help=o.help,
            )(f)
    return f


@click.command("srun", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_table_options
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
def srun(c: Ctx, /, args: tuple[str, ...], **given: Any) -> None:
    """Run CMD as a Slurm step that survives node failures, hangs and (if allowed) crashes."""
    parsed = parse_srun_args(list(args), *scan_names())
    given = merge_scanned(given, parsed.own, scanned_value)
    if not _auto_resume_enabled(str(given["auto_resume"])):
        _exec_plain_srun(c, list(args))
    sys.exit(_supervise(c, parsed, given))


def scanned_value(option: SrunOption, raw: str) -> Any:
    """A value found among srun's options gets the click type's checks, as if given before them."""
    ctx = click.get_current_context()
    param = next(p for p in ctx.command.params if p.name == option.dest)
    return param.type_cast_value(ctx, raw)


def _auto_resume_enabled(value: str) -> bool:
    """The shim's rule (slurm/srun), so both entry points agree: digits only, any non-zero value enables."""
    from hpresilience.errors import ConfigError

    text = value.strip()
    if not text or not (text.isascii() and text.isdigit()):
        raise ConfigError(f"invalid --auto-resume value {value!r} (use 0 or 1)")
    return text.strip("0") != ""


def _real_srun(c: Ctx) -> str:
    from hpresilience.slurm.srun import srun_path

    # The shim may sit first on PATH as `srun`: the wrapper must launch the real one.
    return os.environ.get("HPRESILIENCE_REAL_SRUN") or srun_path(c.config.slurm.bin_dir)


def _exec_plain_srun(c: Ctx, args: list[str]) -> None:
    srun_bin = _real_srun(c)
    os.execv(srun_bin, [srun_bin, *args])


def _supervise(c: Ctx, parsed: SrunArgs, given: dict[str, Any]) -> int:
    from hpresilience.autoresume.inprocess import MODE, InProcessSupervisor
    from hpresilience.autoresume.options import resolve
    from hpresilience.autoresume.supervisor import Supervisor
    from hpresilience.slurm.client import SlurmClient

    opts = resolve(c.config.autoresume, parsed, given, _real_srun(c), os.environ)
    kind = InProcessSupervisor if opts.watch.recovery_mode == MODE else Supervisor
    supervisor = kind(opts, SlurmClient.from_settings(c.config.slurm))

    def handler(signum: int, frame: FrameType | None) -> None:
        supervisor.on_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH):
        signal.signal(sig, handler)
    return supervisor.run()
