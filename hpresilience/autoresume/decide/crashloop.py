"""Crash loops: a step that fails the same way at the same step, attempt after attempt, is the application's.

Each failed attempt leaves one `Crash`: the highest step it reached, its exit code, and a signature (the exit
code and the error's last lines, normalized: task labels, numbers, addresses and node names taken out, so a
pid, a rank, a timestamp or the node it ran on does not make two identical crashes look different). Records
outlive a requeue (WrapperState.crashes).

- `crash_loop_bound` attempts in a row that end at the same step with the same signature stop the job
  (`crash_loop_stopped`, cause `crash_loop`): relaunching it again would fail again. No node is marked: the
  loop is evidence against the program, and the marks a repeated crash would otherwise earn (a collective
  failure implicating a node twice) are held. When the loop ran on the same nodes every time and the
  allocation has other healthy nodes, the next attempt moves there first, so the verdict rests on different
  hardware (`nodes_differ`).
- The same signature at different steps, with the same node failing first, makes that node a suspect
  (`crash_suspect_node`); at `crash_suspect_mark_after` distinct steps it is marked (the program does not fail
  at a fixed place; the node does).
- Exit codes users already emit: `stop_exit_codes` (Megatron's 17, failed on result validation; NVRx's 93, no
  progress) end the job at once; `rerun_exit_codes` (Megatron's 16, resume to disambiguate) relaunch onto
  other nodes where the allocation has them, as a requested rerun, not an application error.

What it cannot tell: a crash whose text changes every time (a random address the normalization misses, a
message naming a file of the attempt) is not a loop; a crash on the same nodes every time with no other node in
the allocation cannot be told from a node that fails deterministically at that step (it stops all the same).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from hpresilience.autoresume.decide.classify import Cause, Diagnosis
from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.autoresume.state import WrapperState
from hpresilience.autoresume.watch.feed import RuleFeed

MAX_KEPT = 32  # crash records kept in the state file: loops are short, suspects need a few
TAIL_LINES = 6  # the error's last lines that make its signature
MAX_LINE = 200
# Known exit codes and what their tools mean by them (the events say it).
MEANING = {
    16: "Megatron rerun state machine: resume to disambiguate (rerun on other hardware)",
    17: "Megatron rerun state machine: failed on result validation",
    93: "NVRx: no progress, stop the job chain",
}
_LABEL = re.compile(r"^ *\d{1,7}: ")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUM = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")
_TASK_END = re.compile(r"^srun: error: (?P<node>[\w.\-]+): tasks? (?P<task>\d+)[\d,\-]*: ")


def normalize(line: str, nodes: Iterable[str] = ()) -> str:
    """One error line with what differs between two runs of the same crash taken out."""
    text = _LABEL.sub("", line)
    for n in sorted(set(nodes), key=len, reverse=True):  # n10 before n1
        if n:
            text = text.replace(n, "<node>")
    text = _NUM.sub("#", _HEX.sub("0x#", text))
    return _SPACE.sub(" ", text).strip()[:MAX_LINE]


def signature(exit_code: int, lines: Sequence[str], nodes: Iterable[str] = ()) -> tuple[str, tuple[str, ...]]:
    """(short hash, normalized tail) of an ended step: its exit code and its error's last non-empty lines."""
    names = list(nodes)
    norm = [x for x in (normalize(ln, names) for ln in lines) if x][-TAIL_LINES:]
    digest = hashlib.sha256("\n".join([str(exit_code), *norm]).encode()).hexdigest()[:12]
    return digest, tuple(norm)


@dataclass(frozen=True)
class Crash:
    attempt: int
    step: int | None  # the highest step the attempt reached (None: it reached none)
    exit_code: int
    signature: str
    nodes: tuple[str, ...]
    first_node: str | None = None  # the node of the first task srun saw fail
    tail: tuple[str, ...] = ()
    hardware: bool = False  # Slurm (or the wrapper) found a bad node: not the program's crash
    blamed: tuple[str, ...] = ()  # the nodes the diagnosis named (a hardware fault's bad nodes)
    at: float = 0.0  # wall clock (epoch seconds) of the record: windows outlive a requeue

    def same_as(self, other: Crash) -> bool:
        return self.step == other.step and self.signature == other.signature

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "nodes": list(self.nodes), "tail": list(self.tail)}

    @classmethod
    def from_dict(cls, d: Any) -> Crash | None:
        """A record from the state file, or None when it is not one (a file from another version)."""
        try:
            step = d["step"]
            return cls(
                attempt=int(d["attempt"]),
                step=None if step is None else int(step),
                exit_code=int(d["exit_code"]),
                signature=str(d["signature"])[:64],
                nodes=tuple(str(n) for n in d["nodes"]),
                first_node=None if d.get("first_node") is None else str(d["first_node"]),
                tail=tuple(str(x)[:MAX_LINE] for x in d.get("tail", ()))[:TAIL_LINES],
                hardware=bool(d.get("hardware", False)),
                blamed=tuple(str(n) for n in d.get("blamed", ()))[:64],
                at=float(d.get("at", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Judgement:
    """What the crash history says about the attempt that just failed."""

    repeats: int = 0  # attempts in a row, this one included, ending at this step with this signature
    loop: bool = False  # repeats reached the bound: stop
    nodes_differ: bool = False  # those attempts did not all run on the same nodes
    move: bool = False  # a repeat on the same nodes: relaunch elsewhere where the allocation allows
    stop_code: str | None = None  # the exit code asks to stop: what its tool means by it
    rerun_elsewhere: str | None = None  # the exit code asks for a rerun on other hardware
    suspects: dict[str, list[int | None]] = field(default_factory=dict)  # node -> distinct steps it crashed at
    again: dict[str, list[int]] = field(default_factory=dict)  # node -> failed attempts naming it, in the window


class CrashHistory:
    def __init__(
        self,
        bound: int,
        mark_after: int,
        stop_codes: Iterable[int],
        rerun_codes: Iterable[int],
        records: Iterable[Any] = (),
        window_s: float = 21600.0,
    ) -> None:
        self.bound = bound
        self.mark_after = mark_after
        self.stop_codes = frozenset(stop_codes)
        self.rerun_codes = frozenset(rerun_codes)
        self.window_s = window_s
        self.crashes: list[Crash] = [c for c in (Crash.from_dict(r) for r in records) if c is not None]

    def repeats(self, crash: Crash) -> int:
        """How many attempts in a row (this one included) ended as `crash` did."""
        n = 1
        for c in reversed(self.crashes):
            if c.hardware or not c.same_as(crash):
                break
            n += 1
        return n

    def add(self, crash: Crash) -> Judgement:
        """Record a failed attempt; what the records now say about it."""
        code = crash.exit_code
        stop = MEANING.get(code, f"exit code {code} is in stop_exit_codes") if code in self.stop_codes else None
        rerun = MEANING.get(code, f"exit code {code} is in rerun_exit_codes") if code in self.rerun_codes else None
        repeats = 0 if crash.hardware or rerun else self.repeats(crash)
        run = [crash, *self.crashes[len(self.crashes) - repeats + 1 :]] if repeats else [crash]
        self.crashes = [*self.crashes, crash][-MAX_KEPT:]
        nodes_differ = len({frozenset(c.nodes) for c in run}) > 1
        loop = self.bound > 0 and repeats >= self.bound
        return Judgement(
            repeats=repeats,
            loop=loop,
            nodes_differ=nodes_differ,
            move=repeats >= 2 and not loop and not nodes_differ,
            stop_code=stop,
            rerun_elsewhere=rerun,
            suspects={} if crash.hardware or rerun else self._suspects(crash),
            again=self._again(crash),
        )

    def _again(self, crash: Crash) -> dict[str, list[int]]:
        """Bad nodes of this failure that earlier failed attempts within `blame_window_s` found bad too: a node
        repaired, back in service and failing again (the program's crashes name no bad node: not counted)."""
        out: dict[str, list[int]] = {}
        for node in crash.blamed:
            attempts = [c.attempt for c in self.crashes if crash.at - c.at <= self.window_s and node in c.blamed]
            if len(attempts) >= 2:
                out[node] = attempts
        return out

    def _suspects(self, crash: Crash) -> dict[str, list[int | None]]:
        """The node that failed first, when it failed first with this signature at more than one step."""
        node = crash.first_node
        if node is None:
            return {}
        steps: list[int | None] = []
        for c in self.crashes:
            if not c.hardware and c.first_node == node and c.signature == crash.signature and c.step not in steps:
                steps.append(c.step)
        return {node: steps} if len(steps) >= 2 else {}

    def should_mark(self, steps: Sequence[int | None]) -> bool:
        return self.mark_after > 0 and len(steps) >= self.mark_after

    def to_records(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.crashes]


def elsewhere(
    allocation: Sequence[str], plan: Sequence[str], unhealthy: Iterable[str] = (), first: str | None = None
) -> list[str]:
    """`plan` with as many of its nodes as the allocation's other healthy nodes allow swapped for those: the node
    that failed first (`first`) before the others, then in rank order. A rerun that must not land on the same
    hardware, as far as the job can avoid it; a crash that follows the step off its first failed node is not
    that node's."""
    bad = set(unhealthy)
    free = iter([n for n in allocation if n not in plan and n not in bad])
    out = list(plan)
    order = sorted(range(len(out)), key=lambda i: (out[i] != first, i))
    for i in order:
        new = next(free, None)
        if new is None:
            break
        out[i] = new
    return out


class CrashWatch:
    """The crash history of one job, as the supervisor uses it: a record per failed attempt (built before the
    diagnosis, so that the marks a repeated crash would earn can be held), its judgement after it."""

    def __init__(
        self,
        settings: AutoResumeSettings,
        state: WrapperState,
        reporter: Reporter,
        progress: ProgressStream,
        feed: RuleFeed,
    ) -> None:
        records = state.crashes if isinstance(state.crashes, list) else []
        self.history = CrashHistory(
            settings.crash_loop_bound,
            settings.crash_suspect_mark_after,
            settings.stop_exit_codes,
            settings.rerun_exit_codes,
            records,
            settings.blame_window_s,
        )
        self.state = state
        self.reporter = reporter
        self.progress = progress
        self.feed = feed

    def crash(self, exit_code: int, plan: Sequence[str], attempt: int) -> Crash:
        first = first_failed_task(self.feed.srun_errors)
        node, task = first if first is not None else (None, None)
        digest, tail = signature(exit_code, self.feed.error_tail(task), plan)
        return Crash(attempt, self._step(task), exit_code, digest, tuple(plan), node, tail)

    def _step(self, task: int | None) -> int | None:
        """The highest step the task that failed first reached (the others may have run one step further before
        srun ended them, or not: their steps would make one crash look like two); else the highest step seen. Its
        output lines (stdout and stderr, read by two threads in no set order) and its heartbeats all count:
        heartbeats alone lag by up to their period (5 s)."""
        if task is not None:
            infos = [i for i in (self.progress.ranks().get(task), self.progress.tasks().get(task)) if i is not None]
            if infos:
                return max(max(i.last_step, i.top) for i in infos)
        seen = self.progress.steps_seen()
        return None if seen is None else seen[1]

    def repeating(self, crash: Crash) -> bool:
        """The attempt ended as the one before it did: a node it would implicate is not to be marked for it."""
        return crash.exit_code not in self.history.rerun_codes and self.history.repeats(crash) >= 2

    def judge(
        self, crash: Crash, diagnosis: Diagnosis, mark: Callable[[str, str, str], bool] | None = None
    ) -> tuple[Diagnosis, Judgement]:
        """The diagnosis in the light of the history: a loop (CRASH_LOOP), a rerun asked for (RERUN), a node that
        crashed the same way at enough different steps marked with `mark` (HARDWARE), or as it was."""
        hardware = diagnosis.cause is Cause.HARDWARE
        crash = replace(crash, hardware=hardware, blamed=tuple(diagnosis.bad_nodes), at=time.time())
        j = self.history.add(crash)
        self.state.crashes = self.history.to_records()
        where = {"step": crash.step, "signature": crash.signature, "exit_code": crash.exit_code}
        for node, attempts in j.again.items():
            self.reporter.decision("node_blamed_again", node=node, attempts=attempts, window_s=self.history.window_s)
        for node, steps in j.suspects.items():
            self.reporter.decision("crash_suspect_node", node=node, steps=steps, attempt=crash.attempt, **where)
            if mark is not None and self.history.should_mark(steps) and node in crash.nodes and not hardware:
                why = f"the same crash (signature {crash.signature}) at steps {steps}, this node failing first"
                if mark(node, why, " | ".join(crash.tail)[:150]):
                    return Diagnosis(Cause.HARDWARE, (node,), f"{node}: {why}", {node: why}), j
        if hardware:
            return diagnosis, j
        if j.stop_code is not None:
            self.reporter.decision("exit_code_stop", meaning=j.stop_code, attempt=crash.attempt, **where)
            return Diagnosis(diagnosis.cause, (), f"{j.stop_code} (exit code {crash.exit_code})"), j
        if j.rerun_elsewhere is not None:
            self.reporter.decision("rerun_requested", meaning=j.rerun_elsewhere, attempt=crash.attempt, **where)
            return Diagnosis(Cause.RERUN, (), f"{j.rerun_elsewhere} (exit code {crash.exit_code})"), j
        if j.repeats >= 2:
            self.reporter.decision(
                "crash_repeated", repeats=j.repeats, bound=self.history.bound, tail=list(crash.tail), **where
            )
        if not j.loop:
            return diagnosis, j
        at = "before its first step" if crash.step is None else f"at step {crash.step}"
        nodes = "on different nodes" if j.nodes_differ else "on the same nodes (no other node to try)"
        detail = (
            f"{j.repeats} attempts in a row failed {at} with the same error (exit code {crash.exit_code}, "
            f"signature {crash.signature}) {nodes}: the application's fault; no node marked"
        )
        self.reporter.decision(
            "crash_loop_stopped",
            stopped_after=j.repeats,
            nodes_differ=j.nodes_differ,
            nodes_marked=0,
            tail=list(crash.tail),
            detail=detail,
            **where,
        )
        return Diagnosis(Cause.CRASH_LOOP, (), detail), j


def first_failed_task(srun_errors: Sequence[str]) -> tuple[str, int] | None:
    """(node, task) of the first task srun reported ending badly ("srun: error: n2: task 1: Exited ...")."""
    for line in srun_errors:
        m = _TASK_END.match(line)
        if m:
            return m.group("node"), int(m.group("task"))
    return None
