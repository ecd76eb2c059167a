"""The one command-line entry point: `hpresilience <command>`.

Commands stay thin: they parse arguments, load the configuration once, and call
into the package. Every error of the package maps to an exit code (see errors.py);
tracebacks are shown only with --verbose.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import click

from hpresilience import __version__
from hpresilience.commands.context import Ctx, pass_ctx
from hpresilience.config import config_as_dict
from hpresilience.errors import EXIT_USAGE, HPResilienceError, MissingExtra, missing_extra
from hpresilience.registry import Registry


class LazyGroup(click.Group):
    """Subcommands imported on first use, so `hpresilience --help` and the srun hand-over start fast."""

    def __init__(self, *args: Any, lazy: Registry[click.Command] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: Registry[click.Command] = lazy or Registry("command")

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy.names()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            cmd = self.lazy.get(cmd_name)
        else:
            found = super().get_command(ctx, cmd_name)
            if found is None:
                return None
            cmd = found
        if cmd_name != "srun":  # srun's arguments are srun's, passed through untouched
            accept_global_options(cmd)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, except that a command whose optional extra is missing is listed as needing it
        (a training environment has no `node` extra): `--help` must work wherever the package is installed."""
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            try:
                cmd = self.get_command(ctx, name)
            except MissingExtra as e:
                cmd = click.Command(name, help=f"(needs: pip install 'hpresilience[{e.extra}]')")
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])


def _set_global(name: str) -> Any:
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        c = ctx.find_object(Ctx)
        if c is not None and value not in (None, False):
            setattr(c, name, value)

    return callback


# Commands already given the global options: get_command runs on every lookup of a command.
_WITH_GLOBAL_OPTIONS: weakref.WeakSet[click.Command] = weakref.WeakSet()


def accept_global_options(cmd: click.Command) -> None:
    """Let --json, -v/--verbose and --config follow the subcommand too (`hpresilience check --json`), as people
    type them; an option the command defines itself keeps the command's meaning."""
    if cmd in _WITH_GLOBAL_OPTIONS:
        return
    taken = {o for p in cmd.params for o in getattr(p, "opts", [])}
    extra: list[tuple[list[str], dict[str, Any], str]] = [
        (["--json"], dict(is_flag=True, default=None), "json_output"),
        (["-v", "--verbose"], dict(is_flag=True, default=None), "verbose"),
        (["--config"], dict(type=click.Path(dir_okay=False), default=None), "config_path"),
    ]
    for opts, kwargs, attr in extra:
        free = [o for o in opts if o not in taken]
        if free:
            cmd.params.append(click.Option(free, expose_value=False, hidden=True, callback=_set_global(attr), **kwargs))
    _WITH_GLOBAL_OPTIONS.add(cmd)
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            accept_global_options(sub)


LAZY_COMMANDS: Registry[click.Command] = Registry(
    "command",
    {
        "devcluster": "hpresilience.commands.devcluster:devcluster",
        "demo": "hpresilience.commands.demo:demo",
        "nodes": "hpresilience.commands.nodes:nodes",
        "check": "hpresilience.commands.check:check",
        "agent": "hpresilience.commands.agent:agent",
        "controller": "hpresilience.commands.controller:controller",
        "replace": "hpresilience.commands.controller:replace",
        "status": "hpresilience.commands.controller:status",
        "events": "hpresilience.commands.events:events",
        "srun": "hpresilience.commands.srun:srun",
        "install": "hpresilience.commands.install:install",
        "uninstall": "hpresilience.commands.install:uninstall",
        "epilog": "hpresilience.commands.epilog:epilog",
        "job": "hpresilience.commands.goodput:job",
        "goodput": "hpresilience.commands.goodput:goodput",
    },
)


@click.group(cls=LazyGroup, lazy=LAZY_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpresilience")
@click.option(
    "--config",
    "config_path",
    envvar="HPRESILIENCE_CONFIG",
    type=click.Path(dir_okay=False),
    help="Configuration file (YAML). Default: $HPRESILIENCE_CONFIG or /etc/hpresilience/config.yaml.",
)
@click.option("--json", "json_output", is_flag=True, help="Machine-readable JSON output for commands that report.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging, and tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, json_output: bool, verbose: bool) -> None:
    """HyperPod-grade resilience for any Slurm cluster."""
    ctx.obj = Ctx(config_path=config_path, json_output=json_output, verbose=verbose)


@cli.group("config")
def config_group() -> None:
    """Inspect the configuration."""


@config_group.command("show")
@pass_ctx
def config_show(c: Ctx) -> None:
    """Print the effective configuration (file merged over defaults)."""
    import yaml

    data = config_as_dict(c.config)
    c.emit(data, yaml.safe_dump(data, sort_keys=False).rstrip())


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map errors to one clear line on stderr and an exit code."""
    args = sys.argv[1:] if argv is None else argv
    verbose = "-v" in args or "--verbose" in args
    try:
        rv = cli.main(args=args, prog_name="hpresilience", standalone_mode=False)
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.exceptions.Abort:
        click.echo("hpresilience: aborted", err=True)
        return 130
    except click.UsageError as e:
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        click.echo(f"hpresilience: usage error: {e.format_message()}{hint}", err=True)
        return EXIT_USAGE
    except click.ClickException as e:
        click.echo(f"hpresilience: {e.format_message()}", err=True)
        return e.exit_code
    except ModuleNotFoundError as e:
        # An extra imported deep inside a command (the wrapper's metrics, a provider's boto3).
        extra = missing_extra(e)
        if extra is None:
            raise
        return _report(extra, verbose)
    except HPResilienceError as e:
        return _report(e, verbose)
    except KeyboardInterrupt:
        return 130
    return rv if isinstance(rv, int) else 0


def _report(e: HPResilienceError, verbose: bool) -> int:
    """One clear line on stderr (more lines indented), the traceback only with --verbose; the exit code."""
    if verbose:
        import traceback

        traceback.print_exc()
    for i, line in enumerate(str(e).splitlines() or [type(e).__name__]):
        click.echo(f"hpresilience: error: {line}" if i == 0 else f"  {line}", err=True)
    return e.exit_code
