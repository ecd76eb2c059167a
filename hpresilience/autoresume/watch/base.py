"""The one protocol every watch over a running step implements, and the verdict it returns.

A detector looks at the step when the runner polls it (about ten times a second, `poll`) and answers with a
`Verdict`, a value: what should happen to the step now (stop it at once, stop it with the shutdown grace, move
it, or nothing yet) and the evidence for it. It never stops the step itself and never calls back into the
supervisor: the runner (launch/runner.py) carries out the first verdict that stops the step, and after the step
the decide package says what the verdict means for the job (decide/verdicts.py) and why the step ended
(decide/ending.py). A probe that takes time (a task count, a liveness srun) runs in a thread of the detector's
own; `poll` returns at once. Detectors are registered by name in DETECTORS (watch/table.py).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, runtime_checkable

from hpresilience.autoresume.watch.hang import Attribution
from hpresilience.autoresume.watch.rules import RuleTripped
from hpresilience.log import get_logger
from hpresilience.reasons import Action

log = get_logger("hpresilience.autoresume")
T = TypeVar("T")


class Act(enum.Enum):
    """What a verdict asks of the running step."""

    STOP_NOW = "stop_now"  # cancel the step at once: a node is lost or the step hangs, it cannot save
    STOP_GRACE = "stop_grace"  # the shutdown signal to the tasks, cancel after the shutdown timeout
    MOVE = "move"  # a planned move: the ranks are told (notice file), save and exit within move_grace_s
    NOTHING = "nothing"  # evidence only, kept with the attempt and acted on after it (a straggler to leave out)
    # The step is not stopped: its tasks have all ended and srun waits on a process that escaped it (and holds its
    # output); the runner kills what escaped on `nodes` and srun ends by itself. The step goes on being watched.
    REAP = "reap"


class StepView(Protocol):
    """What a detector may know of the attempt it watches (launch/plan.AttemptLaunch is one)."""

    @property
    def attempt(self) -> int: ...

    @property
    def nodes(self) -> tuple[str, ...]: ...

    @property
    def requested(self) -> int: ...


@dataclass(frozen=True)
class MarkRequest:
    """A detector's request that the verdict's nodes be marked out of service (decide/marking.py carries it out,
    after the step): the action the mark asks for, why, where the evidence is, and the event that records it."""

    action: Action
    why: str
    evidence: str
    event: str  # `<event>` when marked, `<event>_failed` when Slurm refused


@dataclass(frozen=True)
class Verdict:
    """One detector's answer, with its evidence. `nodes`: the nodes it blames (STOP_NOW), the drained nodes the
    step leaves (MOVE), or the nodes to leave out at the next relaunch (NOTHING)."""

    detector: str
    act: Act
    why: str
    nodes: tuple[str, ...] = ()
    trip: RuleTripped | None = None  # a log rule (or a rule-like stop such as a straggler swap) fired
    hang: Attribution | None = None  # the hang watch's attribution of a hang
    target: tuple[str, ...] | None = None  # MOVE: the nodes the step moves to, when already known (grow back)
    unanswering: bool = False  # `nodes` ran no task when probed (kept out of the step, left in the job)
    leave_out: bool = False  # `nodes` leave the step at the next relaunch, whatever ends this attempt
    mark: MarkRequest | None = None  # STOP_NOW: mark `nodes` out of service too (never done by the detector)


class Detector(Protocol):
    """One watch over the running step. `name` is its registry name (events and tests use it)."""

    name: str

    def start(self, step: StepView) -> None:
        """A new attempt starts on `step`: forget the last one."""

    def poll(self, now: float, step: StepView) -> Verdict | None:
        """Look now (monotonic `now`); never block for long. None: nothing to say."""

    def wait_s(self, now: float) -> float | None:
        """How soon this detector wants the next poll (the runner polls at least every 0.1 s); None: no wish."""


@runtime_checkable
class StepEnvSource(Protocol):
    """A detector that tells the next attempt's ranks something through their environment (integrity.py: the
    newest step they may restore, the steps to skip); the runner asks it before each launch."""

    def step_env(self) -> dict[str, str]: ...


class StopRequest:
    """A stop asked for from outside the step (SIGTERM, SIGINT, scancel): set from the signal handler, read by
    the runner's loop and by the decisions after the step (no callback: one value both sides look at)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def set(self, signum: int) -> None:
        self.signum = self.signum or signum

    def __bool__(self) -> bool:
        return self.signum is not None


@dataclass
class AttemptResult:
    """How one attempt's step ended: srun's exit code, when the failure was seen, and the verdict that stopped it
    (None: it ended by itself, or for a stop request); `verdicts`: every verdict of the attempt, in order."""

    exit_code: int
    failed_at: float  # monotonic time the failure was seen (the kill decision, or srun's exit)
    verdict: Verdict | None = None
    verdicts: list[Verdict] = field(default_factory=list)

    def _of(self, act: Act) -> Verdict | None:
        return self.verdict if self.verdict is not None and self.verdict.act is act else None

    @property
    def blamed(self) -> list[str]:
        v = self._of(Act.STOP_NOW)
        return list(v.nodes) if v is not None else []

    @property
    def trip(self) -> RuleTripped | None:
        return self.verdict.trip if self.verdict is not None else None

    @property
    def hang(self) -> Attribution | None:
        return self.verdict.hang if self.verdict is not None else None

    @property
    def mark(self) -> MarkRequest | None:
        return self.verdict.mark if self.verdict is not None else None

    @property
    def unanswering(self) -> list[str]:
        v = self.verdict
        return list(v.nodes) if v is not None and v.unanswering else []

    @property
    def moved(self) -> str | None:
        v = self._of(Act.MOVE)
        return v.why if v is not None else None

    @property
    def leaving(self) -> list[str]:
        v = self._of(Act.MOVE)
        return list(v.nodes) if v is not None else []

    @property
    def leave_out(self) -> list[str]:
        return [n for v in self.verdicts if v.leave_out for n in v.nodes]

    @property
    def target(self) -> list[str] | None:
        v = self._of(Act.MOVE)
        return list(v.target) if v is not None and v.target is not None else None


class Probe(Generic[T]):
    """A slow look (an srun on the step's nodes) run in a thread so that the watch loop never waits on it;
    `tag` says what it was started for. An exception is logged and reads as `failed` (None)."""

    def __init__(self, tag: object, look: Callable[[], T], failed_event: str) -> None:
        self.tag = tag
        self.value: T | None = None
        self.took_s = 0.0
        self._event = failed_event
        self._thread = threading.Thread(target=self._run, args=(look,), name="hpr-probe", daemon=True)
        self._thread.start()

    def _run(self, look: Callable[[], T]) -> None:
        started = time.monotonic()
        try:
            self.value = look()
        except Exception as err:  # noqa: BLE001 - an unknown answer: the detector decides what it means
            log.warning(self._event, error=str(err)[:300])
        self.took_s = time.monotonic() - started

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float) -> T | None:
        self._thread.join(timeout)
        return None if self._thread.is_alive() else self.value
