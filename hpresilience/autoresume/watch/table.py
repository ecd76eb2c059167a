"""The detector table: every watch over a running step, by name, in the order the runner polls them.

A row names a factory, `"module:attr"`, imported when the wrapper starts: it gets the `WatchContext` (what a
watch may read, and the few probes it may run) and returns its `Detector` (base.py), or None when the watch is
off for this job. Adding a watch is one new module and one row here. The order breaks ties within one poll: the
first verdict that acts on the step wins (a log rule before a hang, a node fault before a planned move).

| name       | watches                                                    | verdict                          |
|------------|------------------------------------------------------------|----------------------------------|
| rules      | the user's log rules (logrules.py)                         | stop with grace (`restart` rule) |
| stragglers | per-node step times, window by window (straggling.py)      | nothing (leave out later), or    |
|            |                                                            | stop with grace (spare at hand)  |
| hang       | no progress past the hang clock's deadline (hangwatch.py)  | stop now, with the attribution;  |
|            |                                                            | reap (the step's tasks all ended)|
| silence    | a node silent while others print, probed (silencewatch.py) | stop now (node not answering)    |
| stall      | the whole step silent a few intervals, every node probed   | stop now (node not answering);   |
|            | (stallwatch.py; synchronous training behind a partition)   | all answer: left to `hang`       |
| nodes      | the job's admin word, the step's nodes (nodefaults.py)     | stop now (fault), move (drained) |
| growback   | nodes back in service for a short step (growback.py)       | move (to the full size)          |
| integrity  | replica disagreement, NaN / loss spike (integrity.py)      | stop now (roll back, mark, stop) |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperState
from hpresilience.autoresume.watch.base import Detector
from hpresilience.autoresume.watch.evidence import HangInvestigator
from hpresilience.autoresume.watch.feed import RuleFeed
from hpresilience.autoresume.watch.nodewatch import NodeWatch
from hpresilience.registry import Registry
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Job


@dataclass(frozen=True)
class WatchContext:
    """What the detectors of one job share. The callables are probes and reads (they act on no step)."""

    opts: WrapperOptions
    client: SlurmClient
    reporter: Reporter
    progress: ProgressStream
    feed: RuleFeed
    env: Mapping[str, str]
    investigator: HangInvestigator
    nodewatch: NodeWatch
    labels_ours: bool  # the wrapper's own task labels name each output line's node
    unhealthy: Callable[[Job], set[str]]  # the job's nodes no step may use (decide/capacity.py)
    back_in_service: Callable[[int, Sequence[str]], list[str] | None]  # a full-size plan, if nodes came back
    state: WrapperState | None = None  # the wrapper's state file: what a detector keeps across a requeue


DetectorFactory = Callable[[WatchContext], "Detector | None"]

_ROWS: tuple[tuple[str, str], ...] = (
    ("rules", "hpresilience.autoresume.watch.logrules:detector"),
    ("stragglers", "hpresilience.autoresume.watch.straggling:detector"),
    ("hang", "hpresilience.autoresume.watch.hangwatch:detector"),
    ("silence", "hpresilience.autoresume.watch.silencewatch:detector"),
    ("stall", "hpresilience.autoresume.watch.stallwatch:detector"),
    ("nodes", "hpresilience.autoresume.watch.nodefaults:detector"),
    ("growback", "hpresilience.autoresume.watch.growback:detector"),
    ("integrity", "hpresilience.autoresume.watch.integrity:detector"),
)


def _callable(obj: object) -> None:
    if not callable(obj):
        raise TypeError("must be callable: WatchContext -> Detector | None")


DETECTORS: Registry[DetectorFactory] = Registry("detector", dict(_ROWS), validate=_callable)


def build_detectors(ctx: WatchContext, registry: Registry[DetectorFactory] | None = None) -> list[Detector]:
    """The job's detectors, the table's rows first in their order, then any other registered (by name)."""
    reg = registry or DETECTORS
    order = [name for name, _ in _ROWS if name in reg]
    order += [name for name in reg.names() if name not in order]
    out: list[Detector] = []
    for name in order:
        found = reg.get(name)(ctx)
        if found is not None:
            out.append(found)
    return out
