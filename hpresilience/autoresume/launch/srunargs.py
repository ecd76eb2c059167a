"""Splitting `hpresilience srun [SRUN_ARGS]... CMD [ARGS]...` into srun's options and the user's command.

The wrapper must know where srun's options end (the first word that is neither an option nor an
option's value) and read the few that set the step's shape (-N, -n, --ntasks-per-node). The options it
controls itself on every attempt (node list, job id, distribution, kill-on-bad-exit) are dropped from
what is passed on, so that a stale value from the batch script can never pin a relaunch to a dead node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpresilience.errors import ConfigError

# srun's short options that take a value (srun.1, 22.05 through 25.x).
SHORT_WITH_VALUE = frozenset("ABCDFGJLMNSTWbcdeimnopqrtwx")
# srun's long options that take a value, as a separate word or after `=` (from srun.1, Slurm 22.05 to 25.x).
# Options whose value is optional (--kill-on-bad-exit, --label, --resv-ports, --nice, --propagate) only take it
# as `--opt=value`, and --spread-job takes none. The shim (slurm/srun) keeps the same two lists; a test holds
# them equal, since a difference would put the start of the user's command in a different place.
LONG_WITH_VALUE = frozenset(
    {
        "accel-bind",
        "account",
        "acctg-freq",
        "bb",
        "bbf",
        "bcast-exclude",
        "begin",
        "chdir",
        "cluster-constraint",
        "clusters",
        "comment",
        "constraint",
        "container",
        "container-id",
        "core-spec",
        "cores-per-socket",
        "cpu-bind",
        "cpu-freq",
        "cpus-per-gpu",
        "cpus-per-task",
        "deadline",
        "delay-boot",
        "dependency",
        "distribution",
        "epilog",
        "error",
        "exclude",
        "export",
        "extra-node-info",
        "gid",
        "gpu-bind",
        "gpu-freq",
        "gpus",
        "gpus-per-node",
        "gpus-per-socket",
        "gpus-per-task",
        "gres",
        "gres-flags",
        "het-group",
        "hint",
        "input",
        "job-name",
        "jobid",
        "licenses",
        "mail-type",
        "mail-user",
        "mcs-label",
        "mem",
        "mem-bind",
        "mem-per-cpu",
        "mem-per-gpu",
        "mincpus",
        "mpi",
        "msg-timeout",
        "network",
        "nodefile",
        "nodelist",
        "nodes",
        "ntasks",
        "ntasks-per-core",
        "ntasks-per-gpu",
        "ntasks-per-node",
        "ntasks-per-socket",
        "open-mode",
        "output",
        "partition",
        "power",
        "prefer",
        "priority",
        "profile",
        "prolog",
        "qos",
        "relative",
        "reservation",
        "segment",
        "signal",
        "slurmd-debug",
        "sockets-per-node",
        "switches",
        "task-epilog",
        "task-prolog",
        "thread-spec",
        "threads",
        "threads-per-core",
        "time",
        "time-min",
        "tmp",
        "tres-bind",
        "tres-per-task",
        "tree-width",
        "uid",
        "wait",
        "wckey",
    }
)

# What the wrapper sets itself on each attempt: never passed through from the user.
CONTROLLED_LONG = frozenset(
    {
        "nodes",
        "nodelist",
        "exclude",
        "jobid",
        "distribution",
        "kill-on-bad-exit",
        "ntasks",
        "nodefile",
        "relative",
        "ntasks-per-node",
    }
)
CONTROLLED_SHORT = frozenset("NwxmnKr")
# The long spellings of the short options we read.
SHORT_TO_LONG = {
    "N": "nodes",
    "n": "ntasks",
    "w": "nodelist",
    "x": "exclude",
    "m": "distribution",
    "K": "kill-on-bad-exit",
    "r": "relative",
    "J": "job-name",
    "l": "label",
}


@dataclass
class SrunArgs:
    passthrough: list[str] = field(default_factory=list)  # options for srun, minus the controlled ones
    command: list[str] = field(default_factory=list)
    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    job_name: str | None = None
    export: str | None = None
    dropped: list[str] = field(default_factory=list)  # controlled options the user gave (logged, not used)
    own: dict[str, str] = field(default_factory=dict)  # the wrapper's own options found among srun's

    def tasks_per_node(self) -> int:
        if self.ntasks_per_node:
            return self.ntasks_per_node
        if self.ntasks and self.nodes and self.ntasks % self.nodes == 0:
            return self.ntasks // self.nodes
        return 1


def _int(value: str, option: str) -> int:
    # -N accepts min-max; the wrapper runs fixed-size steps, so the larger bound is the step size.
    text = value.split("-")[-1].strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"srun option {option} needs a positive number, got {value!r}")
    return int(text)


def parse_srun_args(
    args: list[str], own_with_value: frozenset[str] = frozenset(), own_flags: frozenset[str] = frozenset()
) -> SrunArgs:
    """Split srun's options from the command. `own_*` name the wrapper's long options (without `--`) that
    may also appear among srun's; they are collected in `own` (a flag as "1")."""
    out = SrunArgs()
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            out.command = args[i + 1 :]
            break
        if not word.startswith("-") or word == "-":
            out.command = args[i:]
            break
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            words = [word]
            if name in own_with_value or name in own_flags:
                if not eq and name in own_with_value:
                    if i + 1 >= len(args):
                        raise ConfigError(f"option --{name} needs a value")
                    value = args[i + 1]
                    i += 1
                out.own[name] = value if (eq or name in own_with_value) else "1"
                i += 1
                continue
            if not eq and name in LONG_WITH_VALUE:
                if i + 1 >= len(args):
                    raise ConfigError(f"srun option --{name} needs a value")
                value = args[i + 1]
                words.append(value)
                i += 1
            _take(out, name, value, words, f"--{name}", name in CONTROLLED_LONG)
        else:
            letter = word[1:2]
            value = word[2:]
            words = [word]
            if letter in SHORT_WITH_VALUE and not value:
                if i + 1 >= len(args):
                    raise ConfigError(f"srun option -{letter} needs a value")
                value = args[i + 1]
                words.append(value)
                i += 1
            elif letter in SHORT_WITH_VALUE and value.startswith("="):
                value = value[1:]
            _take(out, SHORT_TO_LONG.get(letter, letter), value, words, f"-{letter}", letter in CONTROLLED_SHORT)
        i += 1
    if not out.command:
        raise ConfigError("no command to run: usage is `srun --auto-resume=1 [SRUN OPTIONS] CMD [ARGS]...`")
    return out


def _take(out: SrunArgs, name: str, value: str, words: list[str], spelled: str, controlled: bool) -> None:
    if name == "nodes":
        out.nodes = _int(value, spelled)
    elif name == "ntasks":
        out.ntasks = _int(value, spelled)
    elif name == "ntasks-per-node":
        out.ntasks_per_node = _int(value, spelled)
    elif name == "job-name":
        out.job_name = value
    elif name == "export":
        out.export = value
        return  # the wrapper writes its own --export, merging this one
    if controlled:
        out.dropped.extend(words)
    else:
        out.passthrough.extend(words)
