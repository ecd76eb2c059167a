"""The wrapper's own command-line options, one declarative row each.

`hpresilience srun` builds its click options from this table (commands/srun.py), the srun argument scan
finds the same options among srun's (srunargs.parse_srun_args with `scan_names()`), and `options.resolve` maps
every given value to where it acts: a field of the `autoresume:` settings section (the command line
overrides the configuration file's value, through the section's own validation) or a keyword of
`options_from`. Adding an option is one row here; an option that overrides a settings field needs
nothing else, since `options_from` already reads that field from the settings it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Kind(Enum):
    """What an option's value is; commands/srun.py turns it into a click type."""

    TEXT = "text"
    INT = "int"
    FLOAT = "float"
    CHOICE = "choice"
    FILE = "file"  # a file path (not a directory)
    FLAG = "flag"  # no value: `--NAME` sets True, `--OFF` sets False


class Target(Enum):
    """Where a given value acts."""

    SETTINGS = "settings"  # overrides the AutoResumeSettings field `field`
    KEYWORD = "keyword"  # passed to options_from as the keyword `field` (the WrapperOptions field it sets)
    COMMAND = "command"  # read by the command itself (the --auto-resume gate, the rules file)


@dataclass(frozen=True)
class SrunOption:
    name: str  # the long option, without `--`
    dest: str  # the click parameter's name, the key of `given`
    kind: Kind
    help: str
    target: Target
    field: str | None = None  # Target.SETTINGS: the AutoResumeSettings field; Target.KEYWORD: options_from's keyword
    default: str | None = None  # None: not given (the configuration file's value applies)
    low: float | None = None  # Kind.INT/FLOAT bounds, checked by click as the value is parsed
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()
    off: str | None = None  # Kind.FLAG: the spelling that sets it False
    example: str = ""  # a value it accepts (the table's test gives every option with it)

    @property
    def spelled(self) -> str:
        return f"--{self.name}"


SRUN_OPTIONS: tuple[SrunOption, ...] = (
    SrunOption(
        "auto-resume",
        "auto_resume",
        Kind.TEXT,
        "1: supervise the step; 0: run plain srun.",
        Target.COMMAND,
        default="1",
        example="0",
    ),
    SrunOption(
        "auto-resume-spares",
        "spares",
        Kind.INT,
        "Nodes of the allocation held back as hot spares (default: config autoresume.spares).",
        Target.SETTINGS,
        field="spares",
        low=0,
        example="1",
    ),
    SrunOption(
        "auto-resume-grow",
        "grow",
        Kind.FLAG,
        "Grow the job back with Slurm's expand dependency when no spare is left (default: on, where "
        "the cluster permits expansion).",
        Target.SETTINGS,
        field="grow_by_expansion",
        off="auto-resume-no-grow",
    ),
    SrunOption(
        "auto-resume-min-nodes",
        "min_nodes",
        Kind.INT,
        "After a fault with no spare, relaunch at once on the healthy nodes when at least this many "
        "(default: config autoresume.min_nodes, 0: off).",
        Target.SETTINGS,
        field="min_nodes",
        low=0,
        example="2",
    ),
    SrunOption(
        "auto-resume-fallback",
        "fallback",
        Kind.CHOICE,
        "No replacement node: requeue the job or fail it.",
        Target.SETTINGS,
        field="fallback_when_no_replacement",
        choices=("requeue", "fail"),
        example="fail",
    ),
    SrunOption(
        "auto-resume-mode",
        "recovery_mode",
        Kind.CHOICE,
        "relaunch: a fault restarts every rank; inprocess: survivors keep running, replacements get state from a peer.",
        Target.SETTINGS,
        field="recovery_mode",
        choices=("relaunch", "inprocess"),
        example="inprocess",
    ),
    SrunOption(
        "auto-resume-standby",
        "standby",
        Kind.CHOICE,
        "inprocess mode: spares: standby ranks wait warm on the hot spares; off: a replacement starts cold.",
        Target.SETTINGS,
        field="standby",
        choices=("spares", "off"),
        example="off",
    ),
    SrunOption(
        "auto-resume-refill-spares",
        "refill_spares",
        Kind.FLAG,
        "inprocess mode: between faults a spare out of service leaves the job, and a spare spent is made good by a "
        "released node once it is idle again (default: on).",
        Target.SETTINGS,
        field="refill_spares",
        off="auto-resume-no-refill-spares",
    ),
    SrunOption(
        "auto-resume-replace-timeout",
        "replace_timeout",
        Kind.FLOAT,
        "Seconds to wait for a replacement node.",
        Target.SETTINGS,
        field="replace_timeout_s",
        low=0,
        low_open=True,
        example="45.5",
    ),
    SrunOption(
        "auto-resume-rules",
        "rules",
        Kind.FILE,
        "YAML: a list of HyperPod log rules, or a logMonitoringConfiguration / runPolicy block.",
        Target.COMMAND,
        example="rules.yaml",
    ),
    SrunOption(
        "auto-resume-state-dir",
        "state_dir",
        Kind.TEXT,
        "Per-job state and event files (shared FS). Default: $SLURM_SUBMIT_DIR/.hpresilience/jobs.",
        Target.KEYWORD,
        field="state_dir",
        example="/shared/jobs",
    ),
    SrunOption(
        "auto-resume-metrics-file",
        "metrics_file",
        Kind.TEXT,
        "Prometheus textfile to write (default: <autoresume.metrics_dir>/hpresilience_job_<JOBID>.prom "
        "when that directory is writable; '' for none).",
        Target.KEYWORD,
        field="metrics_path",
        example="/m/job.prom",
    ),
    SrunOption(
        "auto-resume-poll-interval",
        "poll_interval",
        Kind.FLOAT,
        "Seconds between checks of the step's node states in Slurm (default 1).",
        Target.SETTINGS,
        field="poll_interval_s",
        low=0.1,
        example="0.5",
    ),
    SrunOption(
        "auto-resume-shutdown-signal",
        "shutdown_signal",
        Kind.TEXT,
        "Signal that stops a step before a restart (default: config, SIGTERM).",
        Target.SETTINGS,
        field="shutdown_signal",
        example="SIGINT",
    ),
    SrunOption(
        "auto-resume-shutdown-timeout",
        "shutdown_timeout",
        Kind.FLOAT,
        "Seconds between the shutdown signal and SIGKILL.",
        Target.SETTINGS,
        field="shutdown_timeout_s",
        low=0,
        example="3",
    ),
    SrunOption(
        "auto-resume-master-port-base",
        "master_port_base",
        Kind.INT,
        "MASTER_PORT is this plus an offset that changes every attempt (default 29500).",
        Target.SETTINGS,
        field="master_port_base",
        low=1024,
        high=45000,
        example="31000",
    ),
    SrunOption(
        "pre-train-script",
        "pre_train_script",
        Kind.TEXT,
        "Run once per node before each attempt.",
        Target.KEYWORD,
        field="pre_train_script",
        example="/bin/true",
    ),
    SrunOption(
        "post-train-script",
        "post_train_script",
        Kind.TEXT,
        "Run once per node after each attempt.",
        Target.KEYWORD,
        field="post_train_script",
        example="/bin/true",
    ),
)


def scan_names() -> tuple[frozenset[str], frozenset[str]]:
    """The long names (no `--`) the srun argument scan collects as ours: (options with a value, flags)."""
    values = frozenset(o.name for o in SRUN_OPTIONS if o.kind is not Kind.FLAG)
    flags = frozenset(n for o in SRUN_OPTIONS if o.kind is Kind.FLAG for n in (o.name, o.off) if n)
    return values, flags


def option_named(name: str) -> tuple[SrunOption, str | bool]:
    """The row for a long name the scan found, and what a flag spelling means (True/False; "" for values)."""
    for o in SRUN_OPTIONS:
        if name == o.name:
            return o, (True if o.kind is Kind.FLAG else "")
        if o.kind is Kind.FLAG and name == o.off:
            return o, False
    raise KeyError(name)


def merge_scanned(
    given: Mapping[str, Any],
    own: Mapping[str, str],
    convert: Callable[[SrunOption, str], Any] = lambda option, raw: raw,
) -> dict[str, Any]:
    """The command's values (by `dest`) with those the scan found among srun's options (`own`, by name): one
    given before srun's options wins; a default (--auto-resume's "1") does not count as given. `convert`
    checks a scanned value's text as the command line's parser would."""
    out = dict(given)
    for name, raw in own.items():
        option, flag = option_named(name)
        if out.get(option.dest) is None or out[option.dest] == option.default:
            out[option.dest] = flag if option.kind is Kind.FLAG else convert(option, raw)
    return out
