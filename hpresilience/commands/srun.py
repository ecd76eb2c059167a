"""`hpresilience srun [OPTIONS] [SRUN_ARGS]... CMD [ARGS]...`: srun with --auto-resume, inside a job.

The slurm/srun shim execs this with `--auto-resume=1` removed. Every option srun knows passes through;
the wrapper's own options start with `--auto-resume-` (or are hyperpodrun's --pre/--post-train-script)
and may appear anywhere before the command.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Any

import click

from hpresilience.commands.context import Ctx, pass_ctx

VALUE_OPTIONS = {
    "auto-resume": "auto_resume", "auto-resume-spares": "spares", "auto-resume-fallback": "fallback",
    "auto-resume-replace-timeout": "replace_timeout", "auto-resume-rules": "rules",
    "auto-resume-state-dir": "state_dir", "auto-resume-metrics-file": "metrics_file",
    "auto-resume-poll-interval": "poll_interval", "auto-resume-shutdown-signal": "shutdown_signal",
    "auto-resume-shutdown-timeout": "shutdown_timeout", "auto-resume-master-port-base": "master_port_base",
    "pre-train-script": "pre_train_script", "post-train-script": "post_train_script",
    "auto-resume-min-nodes": "min_nodes",
}
_VALIDATED_FLOATS = {"shutdown_timeout": "shutdown_timeout_s", "replace_timeout": "replace_timeout_s",
                     "poll_interval": "poll_interval_s"}
_OPTION_OF_FIELD = {"shutdown_signal": "--auto-resume-shutdown-signal",
                    "shutdown_timeout_s": "--auto-resume-shutdown-timeout",
                    "replace_timeout_s": "--auto-resume-replace-timeout",
                    "poll_interval_s": "--auto-resume-poll-interval"}
FLAG_OPTIONS = {"auto-resume-grow": ("grow", True), "auto-resume-no-grow": ("grow", False)}


@click.command("srun", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--auto-resume", "auto_resume", default="1", show_default=True,
              help="1: supervise the step; 0: run plain srun.")
@click.option("--auto-resume-spares", "spares", type=click.IntRange(0), default=None,
              help="Nodes of the allocation held back as hot spares (default: config autoresume.spares).")
@click.option("--auto-resume-grow/--auto-resume-no-grow", "grow", default=None,
              help="Grow the job back with Slurm's expand dependency when no spare is left (default: on, where "
                   "the cluster permits expansion).")
@click.option("--auto-resume-min-nodes", "min_nodes", type=click.IntRange(0), default=None,
              help="After a fault with no spare, relaunch at once on the healthy nodes when at least this many "
                   "(default: config autoresume.min_nodes, 0: off).")
@click.option("--auto-resume-fallback", "fallback", type=click.Choice(["requeue", "fail"]), default=None,
              help="No replacement node: requeue the job or fail it.")
@click.option("--auto-resume-replace-timeout", "replace_timeout", type=click.FloatRange(min=0, min_open=True),
              default=None, help="Seconds to wait for a replacement node.")
@click.option("--auto-resume-rules", "rules", type=click.Path(dir_okay=False), default=None,
              help="YAML: a list of HyperPod log rules, or a logMonitoringConfiguration / runPolicy block.")
@click.option("--auto-resume-state-dir", "state_dir", default=None,
              help="Per-job state and event files (shared FS). Default: $SLURM_SUBMIT_DIR/.hpresilience/jobs.")
@click.option("--auto-resume-metrics-file", "metrics_file", default=None,
              help="Prometheus textfile to write (default: <autoresume.metrics_dir>/hpresilience_job_<JOBID>.prom "
                   "when that directory is writable; '' for none).")
@click.option("--auto-resume-poll-interval", "poll_interval", type=click.FloatRange(min=0.1), default=None,
              help="Seconds between checks of the step's node states in Slurm (default 1).")
@click.option("--auto-resume-shutdown-signal", "shutdown_signal", default=None,
              help="Signal that stops a step before a restart (default: config, SIGTERM).")
@click.option("--auto-resume-shutdown-timeout", "shutdown_timeout", type=click.FloatRange(min=0), default=None,
              help="Seconds between the shutdown signal and SIGKILL.")
@click.option("--auto-resume-master-port-base", "master_port_base", type=click.IntRange(1024, 45000),
              default=None, help="MASTER_PORT is this plus an offset that changes every attempt (default 29500).")
@click.option("--pre-train-script", "pre_train_script", default=None, help="Run once per node before each attempt.")
@click.option("--post-train-script", "post_train_script", default=None, help="Run once per node after each attempt.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
def srun(c: Ctx, /, args: tuple[str, ...], **given: Any) -> None:
    """Run CMD as a Slurm step that survives node failures, hangs and (if allowed) crashes."""
    from hpresilience.autoresume.srunargs import parse_srun_args

    parsed = parse_srun_args(list(args), frozenset(VALUE_OPTIONS), frozenset(FLAG_OPTIONS))
    for name, value in parsed.own.items():
        if name in FLAG_OPTIONS:
            key, flag = FLAG_OPTIONS[name]
            given[key] = given[key] if given[key] is not None else flag
        elif given.get(VALUE_OPTIONS[name]) in (None, "1"):
            given[VALUE_OPTIONS[name]] = value
    if not _auto_resume_enabled(str(given["auto_resume"])):
        _exec_plain_srun(c, list(args))
    sys.exit(_supervise(c, parsed, given))


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


def _supervise(c: Ctx, parsed: Any, given: dict[str, Any]) -> int:
    from hpresilience.autoresume.options import options_from
    from hpresilience.autoresume.settings import load_rules_file
    from hpresilience.autoresume.supervisor import Supervisor
    from hpresilience.errors import ConfigError
    from hpresilience.slurm.client import SlurmClient

    settings = c.config.autoresume
    updates: dict[str, Any] = {}
    if given["shutdown_signal"] is not None:
        updates["shutdown_signal"] = given["shutdown_signal"]
    # Through the settings model, so the command line gets the file's checks (no NaN, no infinity).
    for key, field in _VALIDATED_FLOATS.items():
        if given[key] is not None:
            try:
                updates[field] = float(given[key])
            except ValueError:
                raise ConfigError(f"{_OPTION_OF_FIELD[field]}: {given[key]!r} is not a number") from None
    if updates:
        from pydantic import ValidationError

        from hpresilience.settings_base import validation_problems

        try:
            settings = type(settings).model_validate({**settings.model_dump(), **updates})
        except ValidationError as err:
            # The settings' own checks, told in the command line's words: the option, not the key path.
            path, message = validation_problems(err)[0]
            raise ConfigError(f"{_OPTION_OF_FIELD.get(path, '--auto-resume-*')}: {message}") from None
    policy = load_rules_file(given["rules"], settings.run_policy) if given["rules"] else None
    try:
        opts = options_from(
            settings, parsed, _real_srun(c), os.environ, run_policy=policy,
            spares=_opt_int(given["spares"]), grow=given["grow"], fallback=given["fallback"],
            replace_timeout_s=settings.replace_timeout_s, state_dir=given["state_dir"],
            metrics_path=given["metrics_file"], poll_interval_s=settings.poll_interval_s,
            master_port_base=_opt_int(given["master_port_base"]),
            pre_train_script=given["pre_train_script"], post_train_script=given["post_train_script"],
            min_nodes=_opt_int(given["min_nodes"]))
    except ValueError as err:
        raise ConfigError(f"srun --auto-resume: {err}") from None
    supervisor = Supervisor(opts, SlurmClient.from_settings(c.config.slurm))

    def handler(signum: int, frame: FrameType | None) -> None:
        supervisor.on_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, handler)
    return supervisor.run()


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)

