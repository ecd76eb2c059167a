"""Fault event sources: the kernel log (/dev/kmsg, a file, or `dmesg`) and NVML XID events.

Two uses:
- `read_kernel_log`: everything the kernel logged this boot, for the one-shot XID check.
- `XidEventSource.poll(timeout)`: new fault events as they happen, so the agent wakes at once
  instead of waiting for its next cycle. `KernelLogFollower` reads /dev/kmsg records (or lines
  appended to a file, which is what tests and the fault injector write); `NvmlXidSource` waits on an
  NVML event set for XID critical errors.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from pathlib import Path
from typing import Any, Protocol

from hpresilience import proc
from hpresilience.health.xid import FaultEvent, KernelLogParser, normalize_pci
from hpresilience.log import get_logger
from hpresilience.proc import resolve

log = get_logger("hpresilience.health")
MAX_BYTES = 64 * 1024 * 1024


class KernelLogUnavailable(Exception):
    pass


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _read_kmsg_records(fd: int, limit: int = 100_000) -> list[str]:
    out: list[str] = []
    while len(out) < limit:
        try:
            data = os.read(fd, 8192)
        except BlockingIOError:
            break
        except OSError as err:
            if err.errno == errno.EPIPE:  # records were overwritten under us; the next read continues
                continue
            if err.errno == errno.EAGAIN:
                break
            raise
        if not data:
            break
        out.append(data.decode("utf-8", errors="replace").rstrip("\n"))
    return out


def _lines(text: str) -> list[str]:
    # At newlines only: str.splitlines() also breaks at U+0085, U+2028, \x1c..\x1e, which a syslog daemon
    # writes through raw from a crashing program's name, making the text after them a line of its own.
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" and len(lines) > 1 else lines


def read_kernel_log(path: str, dmesg: str = "dmesg", timeout: float = 5.0) -> tuple[list[str], str]:
    """This boot's kernel log lines and their source; KernelLogUnavailable when nothing can be read."""
    p = Path(path)
    errors = []
    try:
        if _is_char_device(p):
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
            try:
                return _read_kmsg_records(fd), str(p)
            finally:
                os.close(fd)
        with open(p, "rb") as f:
            return _lines(f.read(MAX_BYTES).decode("utf-8", errors="replace")), str(p)
    except OSError as err:
        errors.append(f"{p}: {err.strerror or err}")
    exe = resolve(dmesg)
    if exe is None:
        errors.append(f"{dmesg}: not found")
    else:
        res = proc.run([exe], timeout)
        if res.ok:
            return _lines(res.stdout), dmesg
        errors.append(res.describe())
    raise KernelLogUnavailable("; ".join(errors))


class XidEventSource(Protocol):
    def poll(self, timeout: float) -> list[FaultEvent]:
        """Block up to `timeout` s; the fault events that arrived (possibly none)."""
        ...

    def close(self) -> None: ...


class KernelLogFollower:
    """New fault lines of /dev/kmsg (a character device) or a file that grows (tests, fault injection)."""

    def __init__(self, path: str, from_start: bool = False, interval_s: float = 0.05) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self.kmsg = _is_char_device(self.path)
        self.fd: int | None = None
        self.offset = 0
        self.pending = b""
        # One parser for the follower's life: a report split over records may span two polls.
        self._parser = KernelLogParser(source=str(self.path))
        if self.kmsg:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            if not from_start:
                os.lseek(self.fd, 0, os.SEEK_END)
        elif not from_start:
            try:
                self.offset = self.path.stat().st_size
            except OSError:
                self.offset = 0

    def _read_file(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:  # truncated or replaced: a new boot in the fault injector, start over
            self.offset, self.pending = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(min(size - self.offset, MAX_BYTES))
        self.offset += len(data)
        data = self.pending + data
        lines = data.split(b"\n")
        self.pending = lines.pop()  # an incomplete last line waits for its newline
        return [ln.decode("utf-8", errors="replace") for ln in lines]

    def poll(self, timeout: float) -> list[FaultEvent]:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            lines = _read_kmsg_records(self.fd) if self.fd is not None else self._read_file()
            events = [ev for ln in lines for ev in self._parser.feed(ln)]
            left = deadline - time.monotonic()
            if events or left <= 0:
                return events
            if self.fd is not None:
                select.select([self.fd], [], [], left)
            else:
                time.sleep(min(self.interval_s, left))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class NvmlXidSource:
    """XID critical-error events from NVML (event-driven; needs the driver and pynvml)."""

    def __init__(self) -> None:
        import pynvml

        self.nv: Any = pynvml
        pynvml.nvmlInit()
        self.set = pynvml.nvmlEventSetCreate()
        self.bus: dict[int, str] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self.set)
            except pynvml.NVMLError as err:
                log.warning("nvml_xid_events_unavailable", gpu=i, error=str(err))

    def poll(self, timeout: float) -> list[FaultEvent]:
        nv = self.nv
        try:
            data = nv.nvmlEventSetWait_v2(self.set, int(max(0.0, timeout) * 1000))
        except nv.NVMLError as err:
            if getattr(err, "value", None) == nv.NVML_ERROR_TIMEOUT:
                return []
            raise
        if data.eventType != nv.nvmlEventTypeXidCriticalError:
            return []
        try:
            bus = str(nv.nvmlDeviceGetPciInfo(data.device).busId).lower()
        except nv.NVMLError:
            bus = ""
        xid = int(data.eventData)
        return [
            FaultEvent("nvidia", str(xid), normalize_pci(bus) if bus else "", f"NVML XID {xid}", time.time(), "nvml")
        ]

    def close(self) -> None:
        try:
            self.nv.nvmlEventSetFree(self.set)
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass
