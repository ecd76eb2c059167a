"""The one progress stream of a step: output lines with an increasing counter, and per-rank heartbeats.

Hang detection (hang.py), straggler detection (stragglers.py), and later the goodput ledger and elastic
safe points all read this stream; none keeps a progress record of its own. Sources:
- the step's output, per task through srun's `--label` (task id -> node from the attempt's task list):
  `step 12`, `step=12`, `Step 12 |`, `iteration 12/1000`, `global_step 12`, the HF Trainer's
  `{'loss': ...}` dicts (each one is a logging step), tqdm's `12/1000 [`. A counter that differs from the
  last one of the same task and format is progress; a line repeated is not. A lower counter is a new phase
  (a per-epoch step counter starting again, an evaluation loop), and counted: were it not, a job whose
  counter restarts every epoch would look hung for a whole epoch;
- `hpresilience.torch.heartbeat` lines, `[hpr-heartbeat] rank=R node=N pid=P step=S steps=K step_s=F
  work_s=F stack_signal=SIG ckpt_s=F restore_s=F loss=F gnorm=F` (ckpt_s, restore_s: the process's time
  blocked on checkpoints so far, for the goodput ledger; a line with them may lack `step=`; loss, gnorm and the
  replica check's `replica=... bad_rank=R bad_node=N`: kept in `checks` for watch/integrity.py), removed from
  the user's output by `OutputFilter` (their wire format is defined in torch/heartbeat.py, which the wrapper
  must not import: a test holds the two equal).

Hostile lines cost bounded work: lines are capped before they get here, every number is bounded, and a
malformed heartbeat is skipped. A user line that forges a heartbeat can only tell its own job it progressed,
or stop or roll back its own job (integrity.py marks only a node of the step the line came from).
"""

from __future__ import annotations

import math
import re
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpresilience.autoresume.watch.collective import Signature, match_signature
from hpresilience.autoresume.watch.losses import CHECK_KEYS, LossSample, loss_in_line

HEARTBEAT_PREFIX = "[hpr-heartbeat]"
_HB_BYTES = HEARTBEAT_PREFIX.encode()
# srun --label: "<task id>: " (padded) at the start of every line of a task.
_LABEL = re.compile(r"^ *(\d{1,7}): ")
_LABEL_BYTES = re.compile(rb"^ *\d{1,7}: ")
_PARTIAL_LABEL = re.compile(rb"^ *\d{0,7}:?$")
_STEP = re.compile(r"\b(?:global[_ ])?(?:step|iteration|iter)\b\s*[:=#]?\s*(\d{1,12})\b", re.IGNORECASE)
_TQDM = re.compile(r"\b(\d{1,12})/\d{1,12} \[")
_HF = re.compile(r"^\s*\{['\"]loss['\"]: ")
_KV = re.compile(r"(\w{1,16})=(\S{1,64})")
MAX_VALUE = 10**12
INTERVALS_KEPT = 256
# A heartbeat line is ~150 bytes: a longer partial line starting like one is the user's, and is let through.
MAX_HELD = 1024
MAX_SIGNATURES = 50
_SLURM_OWN = ("srun: ", "slurmstepd: ", "slurmstepd-")  # slurmstepd-<node>: error: *** STEP ...


@dataclass(frozen=True)
class Beat:
    """One parsed heartbeat line."""

    rank: int
    node: str
    pid: int
    step: int
    steps: int = 0
    step_s: float | None = None
    work_s: float | None = None
    stack_signal: int = 0
    ckpt_s: float | None = None  # the process's time blocked saving / restoring checkpoints so far
    restore_s: float | None = None
    checks: tuple[tuple[str, str], ...] = ()  # loss, grad norm, replica check fields (watch/integrity.py reads)


def parse_heartbeat(body: str) -> Beat | None:
    """A heartbeat line's fields (label already removed), or None when it is not a valid one."""
    if not body.startswith(HEARTBEAT_PREFIX):
        return None
    kv = dict(_KV.findall(body[len(HEARTBEAT_PREFIX) : 320]))
    try:
        ckpt_s, restore_s = _seconds(kv.get("ckpt_s"), 10**7), _seconds(kv.get("restore_s"), 10**7)
        # A line without a step only reports time blocked on checkpoints (a restore before the first step).
        rank, pid, step = int(kv["rank"]), int(kv["pid"]), int(kv["step"] if ckpt_s is None else kv.get("step", -1))
        steps = int(kv.get("steps", "0"))
        step_s = _seconds(kv.get("step_s"))
        work_s = _seconds(kv.get("work_s"))
        sig = int(kv.get("stack_signal", "0"))
    except (KeyError, ValueError):
        return None
    if not all(0 <= v < MAX_VALUE for v in (rank, pid, steps)) or not -1 <= step < MAX_VALUE or not 0 <= sig < 128:
        return None
    checks = tuple((k, kv[k]) for k in CHECK_KEYS if k in kv)
    return Beat(rank, kv.get("node", "-")[:64], pid, step, steps, step_s, work_s, sig, ckpt_s, restore_s, checks)


def _seconds(raw: str | None, most: float = 86400) -> float | None:
    if raw is None:
        return None
    v = float(raw)
    if not math.isfinite(v) or v < 0 or v > most:
        raise ValueError(raw)
    return v


def output_counter(body: str) -> tuple[str, int] | None:
    """(format, counter) of an output line that shows a step counter, else None."""
    if "{" in body and _HF.match(body):
        return "hf", -1  # counted by occurrence
    if "/" in body and " [" in body:
        m = _TQDM.search(body)
        if m:
            return "tqdm", int(m.group(1))
    low = body.lower()
    if "step" in low or "iter" in low:
        m = _STEP.search(body)
        if m:
            return "step", int(m.group(1))
    return None


@dataclass
class RankInfo:
    """What the stream knows about one rank (heartbeats) or one task (output lines)."""

    node: str
    last_at: float
    last_step: int
    pid: int = 0
    stack_signal: int = 0
    beats: int = 0
    top: int = -1  # the highest counter seen (last_step may go down: a new phase, an error line naming a step)


@dataclass
class StepTime:
    """A per-rank step time sample for straggler detection."""

    at: float
    node: str
    key: str
    seconds: float


@dataclass
class _Attempt:
    started: float
    task_nodes: tuple[str, ...] = ()
    counters: dict[tuple[int, str], int] = field(default_factory=dict)
    tasks: dict[int, RankInfo] = field(default_factory=dict)
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    first_progress: float | None = None
    last_progress: float | None = None
    events: int = 0
    signatures: list[Signature] = field(default_factory=list)
    first_step: int | None = None  # the first and the highest step counter seen (the goodput ledger)
    max_step: int | None = None
    blocked: dict[int, tuple[float, float]] = field(default_factory=dict)  # rank -> (checkpoint, restore) s


class ProgressStream:
    """Progress of the current attempt; fed by the output readers, read by the supervisor's loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self._a = _Attempt(clock())
        self._intervals: deque[float] = deque(maxlen=INTERVALS_KEPT)
        self.samples: deque[StepTime] = deque(maxlen=4096)
        self.listeners: list[Callable[[StepTime], None]] = []
        self.checks: deque[LossSample] = deque(maxlen=4096)  # losses and replica verdicts, drained by their watch

    def reset(self, task_nodes: Sequence[str] = ()) -> None:
        """A new attempt: `task_nodes[i]` is the node of srun task i."""
        with self.lock:
            self._a = _Attempt(self.clock(), tuple(task_nodes))
            self._intervals.clear()
            self.samples.clear()
            self.checks.clear()

    # -- feeding ---------------------------------------------------------------------------------------
    def feed_lines(self, lines: Sequence[str], now: float | None = None) -> None:
        """Whole lines of the step's output, srun labels still on (when the step has them)."""
        t = self.clock() if now is None else now
        with self.lock:
            for line in lines:
                # Most lines of a chatty job carry none of the words that progress, a heartbeat or a collective
                # failure needs: substring tests (C speed, ~0.3 us) reject them before any regex runs.
                if not (
                    "tep" in line
                    or "ter" in line
                    or "TEP" in line
                    or "TER" in line
                    or "loss" in line
                    or " [" in line
                    or "hpr-" in line
                    or "NCCL" in line
                    or "peer" in line
                    or "out" in line
                ):
                    continue
                task: int | None = None
                body = line
                m = _LABEL.match(line)
                if m:
                    task, body = int(m.group(1)), line[m.end() :]
                if body.startswith(HEARTBEAT_PREFIX):
                    beat = parse_heartbeat(body)
                    if beat is not None:
                        self._on_beat(beat, t)
                    continue
                if body.startswith(_SLURM_OWN):
                    continue  # "slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED": Slurm's words, not progress
                found = output_counter(body)
                if "loss" in body and (loss := loss_in_line(body)) is not None:
                    step = found[1] if found is not None and found[0] == "step" else -1
                    self.checks.append(LossSample(t, f"task{task}", self.node_of_task(task) or "", step, (), loss))
                if found is not None:
                    self._on_output(task, found[0], found[1], t)
                elif len(self._a.signatures) < MAX_SIGNATURES:
                    kind = match_signature(body)
                    if kind is not None:
                        self._a.signatures.append(Signature(kind, task, body[:300], t))

    def _progress(self, info: RankInfo | None, t: float) -> None:
        a = self._a
        if info is not None and info.last_at < t:
            self._intervals.append(t - info.last_at)
        a.events += 1
        a.first_progress = a.first_progress if a.first_progress is not None else t
        a.last_progress = t

    def _on_output(self, task: int | None, fmt: str, value: int, t: float) -> None:
        a = self._a
        key = (-1 if task is None else task, fmt)
        last = a.counters.get(key)
        if fmt == "hf":
            value = (last or 0) + 1
        elif last is not None and value == last:
            return
        a.counters[key] = value
        if fmt != "hf":
            self._step_seen(value)
        tid = -1 if task is None else task
        node = a.task_nodes[tid] if 0 <= tid < len(a.task_nodes) else ""
        info = a.tasks.get(tid)
        self._progress(info, t)
        if info is None:
            a.tasks[tid] = RankInfo(node, t, value, top=value)
        else:
            # Output lines give wall time per step; once ranks send heartbeats (work time), only those count:
            # mixed, a node's median would blend the two.
            if last is not None and value > last and fmt != "hf" and not a.ranks:
                self._sample(StepTime(t, node, f"task{tid}", (t - info.last_at) / (value - last)))
            info.last_at, info.last_step, info.top = t, value, max(info.top, value)

    def _on_beat(self, beat: Beat, t: float) -> None:
        a = self._a
        if beat.ckpt_s is not None or beat.restore_s is not None:
            a.blocked[beat.rank] = (beat.ckpt_s or 0.0, beat.restore_s or 0.0)
        if beat.checks:
            self.checks.append(LossSample(t, f"rank{beat.rank}", beat.node, beat.step, beat.checks))
        if beat.step < 0:
            return  # blocked time only: no progress
        info = a.ranks.get(beat.rank)
        if info is not None and beat.step <= info.last_step:
            info.pid, info.stack_signal = beat.pid, beat.stack_signal
            return
        self._progress(info, t)
        self._step_seen(beat.step)
        if info is None:
            info = a.ranks[beat.rank] = RankInfo(beat.node, t, beat.step)
        info.node, info.last_at, info.last_step = beat.node, t, beat.step
        info.pid, info.stack_signal = beat.pid, beat.stack_signal
        info.beats += 1
        seconds = beat.work_s if beat.work_s is not None else beat.step_s
        if seconds is not None and beat.steps:
            self._sample(StepTime(t, beat.node, f"rank{beat.rank}", seconds))

    def _step_seen(self, step: int) -> None:
        a = self._a
        a.first_step = step if a.first_step is None else a.first_step
        a.max_step = step if a.max_step is None else max(a.max_step, step)

    def _sample(self, s: StepTime) -> None:
        self.samples.append(s)
        for fn in self.listeners:
            fn(s)

    # -- reading ---------------------------------------------------------------------------------------
    @property
    def attempt_started(self) -> float:
        return self._a.started

    def last_progress(self) -> float | None:
        return self._a.last_progress

    def steps_seen(self) -> tuple[int, int] | None:
        """(first, highest) step counter of this attempt, None before any."""
        with self.lock:
            a = self._a
            return None if a.first_step is None or a.max_step is None else (a.first_step, a.max_step)

    def blocked(self) -> tuple[float, float] | None:
        """Seconds training was blocked (checkpoint save, restore) in this attempt, from hpresilience.torch's
        reports: the slowest rank's, as the others wait for it. None when no rank reported any."""
        with self.lock:
            b = self._a.blocked
            if not b:
                return None
            return max(c for c, _ in b.values()), max(r for _, r in b.values())

    def first_progress(self) -> float | None:
        return self._a.first_progress

    def progress_events(self) -> int:
        return self._a.events

    def median_interval(self) -> float | None:
        with self.lock:
            return statistics.median(self._intervals) if self._intervals else None

    def ranks(self) -> dict[int, RankInfo]:
        with self.lock:
            return dict(self._a.ranks)

    def tasks(self) -> dict[int, RankInfo]:
        with self.lock:
            return dict(self._a.tasks)

    @property
    def task_nodes(self) -> tuple[str, ...]:
        return self._a.task_nodes

    def signatures(self) -> list[Signature]:
        with self.lock:
            return list(self._a.signatures)

    def node_of_task(self, task: int | None) -> str | None:
        nodes = self._a.task_nodes
        return nodes[task] if task is not None and 0 <= task < len(nodes) else None


class OutputFilter:
    """Forwards a stream's bytes as they come, minus heartbeat lines and minus the task labels the wrapper
    added itself (`strip_labels`): the user sees what the step printed. A partial line that may still
    become a heartbeat is held back until its newline (or until it cannot be one)."""

    def __init__(self, strip_labels: bool) -> None:
        self.strip_labels = strip_labels
        self.pending = b""
        self.at_line_start = True

    def push(self, chunk: bytes) -> bytes:
        data = self.pending + chunk if self.pending else chunk
        self.pending = b""
        if not self.strip_labels and _HB_BYTES not in data and data.endswith(b"\n"):
            # Fast path: no line is a heartbeat, and no partial line may become one.
            self.at_line_start = True
            return data
        out: list[bytes] = []
        pos, n = 0, len(data)
        while pos < n:
            nl = data.find(b"\n", pos)
            end = n if nl < 0 else nl + 1
            piece = data[pos:end]
            if self.at_line_start:
                body = piece
                if self.strip_labels:
                    m = _LABEL_BYTES.match(piece)
                    if m:
                        body = piece[m.end() :]
                    elif nl < 0 and _PARTIAL_LABEL.match(piece) and len(piece) < 16:
                        self.pending = piece
                        break
                if body.startswith(_HB_BYTES) and (nl >= 0 or len(piece) < MAX_HELD):
                    if nl < 0:
                        self.pending = piece
                        break
                    # a whole heartbeat line: not the user's output
                elif nl < 0 and _HB_BYTES.startswith(body):
                    self.pending = piece
                    break
                else:
                    out.append(body)
            else:
                out.append(piece)
            self.at_line_start = nl >= 0
            pos = end
        return b"".join(out)

    def flush(self) -> bytes:
        tail, self.pending = self.pending, b""
        if self.strip_labels:
            m = _LABEL_BYTES.match(tail)
            tail = tail[m.end() :] if m else tail
        return b"" if tail.startswith(_HB_BYTES) else tail
