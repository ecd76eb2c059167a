"""Why a step failed: a hardware fault, a hang or slowdown caught by a log rule, or the application.

Slurm is the source of truth for hardware: a node of the step marked FAIL (sinfo `failg`/`fail`), DOWN or
not responding, any node whose reason asks for an action (`Action:Replace`, `Action:Reboot`), a node that
Slurm excised from a `--no-kill` job, or srun reporting a node failure. Everything else that ends a step
non-zero is the application's, unless a log rule fired first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from hpresilience.autoresume.watch.nodewatch import node_is_bad
from hpresilience.log import get_logger
from hpresilience.slurm.models import Node
from hpresilience.slurm.srun import nodes_from_srun_errors

log = get_logger("hpresilience.autoresume")


class Cause(str, Enum):
    HARDWARE = "hardware"
    HANG = "hang"
    COLLECTIVE = "collective"  # a collective timeout/abort with every node healthy
    SLOW = "slow"
    APPLICATION = "application"
    INTEGRITY = "integrity"  # the integrity watch (replica check, NaN, loss spike) asks for a rollback
    DIVERGED = "diverged"  # the integrity watch's policy is stop (or its rollbacks are spent): the job ends
    CRASH_LOOP = "crash_loop"  # the same crash at the same step, attempt after attempt (decide/crashloop.py)
    RERUN = "rerun"  # the step asked to run again on other hardware (Megatron's exit code 16)
    NONE = "none"  # the step succeeded


@dataclass(frozen=True)
class Diagnosis:
    cause: Cause
    bad_nodes: tuple[str, ...] = ()
    detail: str = ""
    evidence: dict[str, str] = field(default_factory=dict)


def classify(
    exit_code: int,
    step_nodes: Sequence[str],
    node_states: Mapping[str, Node],
    allocation: Sequence[str],
    srun_errors: Iterable[str] = (),
    rule_fired: tuple[Cause, str] | None = None,
    blamed_while_running: Iterable[str] = (),
) -> Diagnosis:
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
