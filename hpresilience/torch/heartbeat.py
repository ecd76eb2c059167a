"""Per-rank progress heartbeats for `srun --auto-resume=1`, and Python stacks on request.

One call per training step tells the wrapper that this rank made progress, with its step number and step
time; the wrapper's progress stream (hpresilience/autoresume/progress.py) reads these for hang detection,
attribution and stragglers:

    from hpresilience.torch import heartbeat
    for step in ...:
        with heartbeat.working():   # optional: the rank's own compute, not the time it waits for others
            ...forward/backward...
        heartbeat.beat(step)        # or beat(step, loss=..., grad_norm=...): the NaN / spike watch

Outside the wrapper (no HPR_AUTORESUME_JOB in the environment) every call is a no-op. Under it, a beat
is one short line on the process's stderr, `[hpr-heartbeat] k=v ...`, written at most once per
HPR_HEARTBEAT_EVERY_S seconds (default 5) per rank with the steps since the last line folded in; the
wrapper removes these lines before the user's output, so nothing floods. Why work time: in synchronous
data parallel training every rank waits for the slowest in the gradient all-reduce, so wall step times are
equal on all ranks and only the time a rank spends on its own work shows a slow node.

Time a rank spends blocked in a checkpoint save or restore (TieredCheckpointer's blocking part of save,
async_save, load, flush, close and the staging waits; the DCP writers and readers it hands out, HyperPod's
drop-in classes included; through `blocking`) is reported for the goodput ledger: the beat lines carry the
process's totals so far (`ckpt_s=F restore_s=F`); a block that ends writes a line at once when the rate
allows (one without `step=` when no step was beaten yet, e.g. the restore before training), else the next
beat carries it, and what is left unsaid at exit is written then.

The first beat also registers `faulthandler` on HPR_STACK_SIGNAL (SIGRTMIN+3 by default), writing all
threads' stacks to `stacks-rank<R>-<pid>.txt` in HPR_EVIDENCE_DIR: when the wrapper declares a hang it
sends that signal only to processes that announced it, so a process that never registered is not killed
by an unhandled real-time signal. The wire format is mirrored by progress.py (a test holds them equal):
this module must not import the wrapper, and the wrapper must not import torch.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import functools
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, Literal, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

PREFIX = "[hpr-heartbeat]"
DEFAULT_EVERY_S = 5.0
JOB_ENV = "HPR_AUTORESUME_JOB"


def _stack_signal() -> int:
    raw = os.environ.get("HPR_STACK_SIGNAL", "")
    if raw.isdigit():
        return int(raw)
    return int(signal.SIGRTMIN) + 3


class Heartbeat:
    """The heartbeat of one process (rank). Thread-safe; cheap when nothing is written (two clock reads)."""

    def __init__(
        self, env: dict[str, str] | None = None, fd: int = 2, clock: Callable[[], float] = time.monotonic
    ) -> None:
        e = dict(os.environ if env is None else env)
        self.enabled = bool(e.get(JOB_ENV))
        try:
            self.every_s = max(0.0, float(e.get("HPR_HEARTBEAT_EVERY_S", DEFAULT_EVERY_S)))
        except ValueError:
            self.every_s = DEFAULT_EVERY_S
        self.rank = _int(e.get("RANK", e.get("SLURM_PROCID", "0")))
        self.node = (e.get("SLURMD_NODENAME") or socket.gethostname()).split()[0][:64] if self.enabled else ""
        self.evidence_dir = e.get("HPR_EVIDENCE_DIR", "")
        self.fd = fd
        self._clock = clock
        self._lock = threading.Lock()
        self._last_beat: float | None = None
        self._last_step: int | None = None
        self._last_write = float("-inf")
        self._steps = 0
        self._step_s = 0.0
        self._work_s = 0.0
        self._work_open = 0
        self._stack_signal = 0
        self._stack_file: IO[str] | None = None
        self._installed = False
        self._blocked = {"checkpoint": 0.0, "restore": 0.0}  # seconds so far in this process
        self._blocked_unsaid = False
        self._atexit = False
        self._loss: tuple[float | None, float | None] = (None, None)  # the last step's loss and grad norm

    # -- stacks ----------------------------------------------------------------------------------------
    def _install_stacks(self) -> None:
        """Register faulthandler once, into a file of our own in the wrapper's evidence directory."""
        self._installed = True
        d = self.evidence_dir
        if not d:
            return
        dfd = -1
        try:
            # Opened once and judged on the descriptor; files are made relative to it, so whoever can rename
            # the directory's path (its parent's owner) cannot redirect them after the check.
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
            st = os.fstat(dfd)
            # The wrapper made it 0700 and ours: anything else (a link, another owner) is not trusted.
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                os.close(dfd)
                return
            name = f"stacks-rank{self.rank}-{os.getpid()}.txt"
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
            self._stack_file = os.fdopen(fd, "w")
            sig = _stack_signal()
            faulthandler.register(sig, file=self._stack_file, all_threads=True, chain=False)
            self._stack_signal = sig
        except (OSError, ValueError, RuntimeError):
            self._stack_signal = 0
            if dfd >= 0:
                os.close(dfd)
            return
        if _int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0")) > 0:
            threading.Thread(
                target=self._flight_recorder_on_request, args=(dfd,), name="hpr-fr-dump", daemon=True
            ).start()
        else:
            os.close(dfd)

    def _flight_recorder_on_request(self, dfd: int) -> None:
        """gloo records collectives (TORCH_FR_BUFFER_SIZE) but never dumps them: when the wrapper asks
        (`fr-request` appears in the evidence directory, at a hang), write this process's records once to
        `fr-rank<R>-<pid>.pkl` there (new file, no link followed, relative to the directory judged at the
        first beat). A thread of its own, so a main thread stuck in a collective (the GIL released) does not
        stop it; a stopped process writes nothing, which says as much. Four stats a second."""
        while not _exists("fr-request", dfd):
            time.sleep(0.25)
        try:
            from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]

            data = _dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
            name = f"fr-rank{self.rank}-{os.getpid()}.pkl"
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except Exception:  # noqa: BLE001 - no flight recorder here (no torch.distributed): nothing to add
            return
        finally:
            os.close(dfd)

    # -- beats -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Time this rank spends on its own work (compute, I/O), not waiting for the others."""
        start = self._clock()
        try:
            yield
        finally:
            with self._lock:
                self._work_s += self._clock() - start
                self._work_open += 1

    def blocked(self, kind: Literal["checkpoint", "restore"], seconds: float) -> None:
        """Training was blocked `seconds` saving (`checkpoint`) or loading (`restore`) a checkpoint."""
        if not self.enabled or not seconds >= 0:
            return
        now = self._clock()
        with self._lock:
            self._blocked[kind] += seconds
            self._blocked_unsaid = True
            if not self._atexit:
                self._atexit = True
                atexit.register(self.flush_blocked)
            if now - self._last_write < self.every_s:
                return  # the next beat (or the exit) says it
            line = self._line(self._last_step)
            self._last_write = now
            self._blocked_unsaid = False
        self._write(line)

    def flush_blocked(self) -> None:
        """Say the blocked time not yet written (at exit: the last save's)."""
        with self._lock:
            if not self._blocked_unsaid:
                return
            line = self._line(self._last_step)
            self._blocked_unsaid = False
        self._write(line)

    def beat(
        self, step: int, work_s: float | None = None, loss: float | None = None, grad_norm: float | None = None
    ) -> None:
        """This rank finished `step`. `work_s`: its own work in the step, if measured outside `working()`;
        `loss`, `grad_norm`: the step's, for the wrapper's NaN and spike watch (a non-finite one is written
        at once, whatever the rate: the wrapper must see the step it happened at)."""
        if not self.enabled:
            return
        now = self._clock()
        bad = any(v is not None and not math.isfinite(v) for v in (loss, grad_norm))
        with self._lock:
            if loss is not None or grad_norm is not None:
                self._loss = (loss, grad_norm)
            if step == self._last_step and work_s is None:
                # The same step again (a checkpoint save after the loop's own beat): not progress. A
                # non-finite loss given with it is still said at once.
                if not bad:
                    return
                line = self._line(int(step))
                self._last_write = now
            else:
                due = self._progress(step, work_s, now, bad)
                if due is None:
                    return
                line = due
        self._write(line)

    def _progress(self, step: int, work_s: float | None, now: float, bad: bool) -> str | None:
        """A new step (under the lock): fold it into the window; the line to write now, if one is due."""
        self._last_step = step
        if not self._installed:
            self._install_stacks()
        if work_s is not None and work_s >= 0:
            self._work_s += work_s
            self._work_open += 1
        if self._last_beat is None:  # the first step's time is unknown: its work is not counted either
            self._work_s, self._work_open = 0.0, 0
        else:
            self._step_s += max(0.0, now - self._last_beat)
            self._steps += 1
        self._last_beat = now
        if now - self._last_write < self.every_s and not bad:
            return None
        line = self._line(int(step))
        self._last_write = now
        self._blocked_unsaid = False
        self._steps, self._step_s, self._work_s, self._work_open = 0, 0.0, 0.0, 0
        return line

    def report(self, step: int, **fields: str | int) -> None:
        """A line of its own at once, outside the rate (the replica check's verdict, torch/integrity.py)."""
        if not self.enabled:
            return
        extra = " ".join(f"{k}={str(v).split()[0][:64] if str(v).split() else '-'}" for k, v in fields.items())
        self._write(f"{PREFIX} rank={self.rank} node={self.node or '-'} pid={os.getpid()} step={step} {extra}\n")

    def _write(self, line: str) -> None:
        try:
            os.write(self.fd, line.encode())
        except OSError:
            pass  # a closed stderr must never stop training

    def _line(self, step: int | None) -> str:
        fields = [f"rank={self.rank}", f"node={self.node or '-'}", f"pid={os.getpid()}"]
        if step is not None:
            fields.append(f"step={step}")
        if self._blocked["checkpoint"] or self._blocked["restore"]:
            fields += [f"ckpt_s={self._blocked['checkpoint']:.3f}", f"restore_s={self._blocked['restore']:.3f}"]
        if self._steps:
            fields += [f"steps={self._steps}", f"step_s={self._step_s / self._steps:.6f}"]
            if self._work_open:
                fields.append(f"work_s={self._work_s / self._steps:.6f}")
        if self._stack_signal:
            fields.append(f"stack_signal={self._stack_signal}")
        loss, gnorm = self._loss
        fields += [f"{k}={v:.6g}" for k, v in (("loss", loss), ("gnorm", gnorm)) if v is not None]
        return f"{PREFIX} {' '.join(fields)}\n"


def _exists(name: str, dfd: int) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _int(raw: str) -> int:
    return int(raw) if raw.isdigit() else 0


_default: Heartbeat | None = None
_default_lock = threading.Lock()


def default() -> Heartbeat:
    """The process's heartbeat, made on first use from the environment."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Heartbeat()
        return _default


def beat(step: int, work_s: float | None = None, loss: float | None = None, grad_norm: float | None = None) -> None:
    """One call per training step (see the module doc); a no-op outside `srun --auto-resume=1`."""
    default().beat(step, work_s, loss, grad_norm)


def working() -> contextlib.AbstractContextManager[None]:
    """`with heartbeat.working(): ...` around the rank's own work in a step."""
    return default().working()


class _Depth(threading.local):
    n = 0


# Blocking calls nest (close() flushes, load() flushes, async_save() waits for the save before): only the
# outermost of a thread counts, or its time would be reported twice.
_depth = _Depth()


def blocked(kind: Literal["checkpoint", "restore"], seconds: float) -> None:
    """Training was blocked `seconds` on a checkpoint (outside any `blocking` call, which counts its own)."""
    if _depth.n == 0:
        default().blocked(kind, seconds)


@contextlib.contextmanager
def blocked_while(kind: Literal["checkpoint", "restore"]) -> Iterator[None]:
    """`with heartbeat.blocked_while("checkpoint"): ...`: the block's duration is blocked time, once."""
    hb = default()
    if not hb.enabled:
        yield
        return
    outer = _depth.n == 0
    _depth.n += 1
    start = time.monotonic()
    try:
        yield
    finally:
        _depth.n -= 1
        if outer:
            hb.blocked(kind, time.monotonic() - start)


def blocking(kind: Literal["checkpoint", "restore"]) -> Callable[[F], F]:
    """Decorator: the call's duration is time training was blocked on a checkpoint (`Heartbeat.blocked`),
    unless it runs inside another such call."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not default().enabled:
                return fn(*args, **kwargs)
            with blocked_while(kind):
                return fn(*args, **kwargs)

        return timed  # type: ignore[return-value]

    return wrap
