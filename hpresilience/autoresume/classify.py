"""Why a step failed: a hardware fault, a hang or slowdown caught by a log rule, or the application.

Slurm is the source of truth for hardware: a node of the step marked FAIL (sinfo `failg`/`fail`), DOWN or
not responding, any node whose reason asks for an action (`Action:Replace`, `Action:Reboot`), a node that
Slurm excised from a `--no-kill` job, or srun reporting a node failure. Everything else that ends a step
non-zero is the application's, unless a log rule fired first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from hpresilience.errors import SlurmParseError
from hpresilience.log import get_logger
from hpresilience.reasons import parse_reason
from hpresilience.slurm.hostlist import expand
from hpresilience.slurm.models import Node

log = get_logger("hpresilience.autoresume")


class Cause(str, Enum):
    HARDWARE = "hardware"
    HANG = "hang"
    SLOW = "slow"
    APPLICATION = "application"
    NONE = "none"  # the step succeeded


# srun's own words when a node of the step is lost (srun/libsrun, 22.05 through 25.x).
NODE_FAILURE_LINE = re.compile(
    r"^srun: error: (?:Node failure on (?P<node>[\w.\-\[\],]+)"
    r"|Task launch for StepId=\S+ failed on node (?P<node2>[\w.\-]+)"
    r"|(?P<node3>[\w.\-]+): tasks? [\d,\-]+: Unknown error)", re.MULTILINE)
HARD_STATES = frozenset({"FAIL", "DOWN", "NOT_RESPONDING"})
# srun's line for each task that ended badly: "n2: task 1: Exited with exit code 3", "n1: task 0: Terminated".
TASK_END_LINE = re.compile(r"^srun: error: [\w.\-]+: tasks? [\d,\-]+: (?P<what>.*)$", re.MULTILINE)
TASK_EXITED = re.compile(r"^Exited with exit code (?P<code>\d+)")


def node_is_bad(node: Node) -> bool:
    """The node must leave the step: Slurm or the agent says it is broken, or its reason asks for action."""
    if node.states & HARD_STATES:
        return True
    return parse_reason(node.reason).action is not None and node.has("DRAIN", "FAIL", "DOWN")


def nodes_from_srun_errors(lines: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for line in lines:
        for m in NODE_FAILURE_LINE.finditer(line):
            name = m.group("node") or m.group("node2") or m.group("node3")
            if not name:
                continue
            # srun names several lost nodes as one hostlist ("Node failure on n[2-3]").
            try:
                found.update(expand(name))
            except SlurmParseError:
                log.warning("srun_node_list_unreadable", nodes=name[:200])
    return found


def application_exit_code(exit_code: int, srun_errors: Iterable[str]) -> int:
    """The step's exit code as the application set it.

    srun exits with the highest code over its tasks, a signal counting as 128+signal. When one task exits
    3, srun (--kill-on-bad-exit) terminates the others, and their 143 hides the 3 that caused it, and with
    it noRetryExitCodes. So when srun's code is a signal's and the first task srun reports ended by
    exiting, that task's code is the step's.
    """
    if exit_code <= 128:
        return exit_code
    first = next((m.group("what") for line in srun_errors for m in TASK_END_LINE.finditer(line)), None)
    exited = TASK_EXITED.match(first) if first is not None else None
    return int(exited.group("code")) if exited and int(exited.group("code")) else exit_code


@dataclass(frozen=True)
class Diagnosis:
    cause: Cause
    bad_nodes: tuple[str, ...] = ()
    detail: str = ""
    evidence: dict[str, str] = field(default_factory=dict)


def classify(exit_code: int, step_nodes: Sequence[str], node_states: Mapping[str, Node],
             allocation: Sequence[str], srun_errors: Iterable[str] = (), rule_fired: tuple[Cause, str] | None = None,
             blamed_while_running: Iterable[str] = ()) -> Diagnosis:
    """Classify one ended step. `node_states` maps node name to its current state (missing: unknown)."""
    blamed = list(blamed_while_running)
    if exit_code == 0 and not blamed and rule_fired is None:
        return Diagnosis(Cause.NONE)
    bad: dict[str, str] = {}
    for name in blamed:
        bad[name] = "marked while the step ran"
    for name in step_nodes:
        node = node_states.get(name)
        if node is not None and node_is_bad(node):
            bad.setdefault(name, f"{node.state_text} ({node.reason or 'no reason'})")
        elif name not in allocation:
            bad.setdefault(name, "excised from the job by Slurm")
    for name in nodes_from_srun_errors(srun_errors):
        if name in step_nodes:
            bad.setdefault(name, "srun reported a node failure")
    if bad:
        names = tuple(n for n in step_nodes if n in bad)
        return Diagnosis(Cause.HARDWARE, names, "; ".join(f"{n}: {bad[n]}" for n in names), dict(bad))
    if rule_fired is not None:
        return Diagnosis(rule_fired[0], (), rule_fired[1])
    return Diagnosis(Cause.APPLICATION, (), f"step exited {exit_code} with every node healthy")
