"""Fault event sources: the kernel log follower, the dmesg fallback."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hpresilience.health.events import KernelLogFollower, read_kernel_log
from tests.health.conftest import FIXTURES


def test_follower_returns_only_new_fault_lines_and_waits_for_complete_lines(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("4,1,1,-;NVRM: Xid (PCI:0000:53:00): 79, old one from before we started\n")
    f = KernelLogFollower(str(log))
    assert f.poll(0) == []
    with open(log, "a") as fh:
        fh.write("6,2,2,-;eth0: link up\n4,3,3,-;NVRM: Xid (PCI:0000:64:00): 48, pid=1, DB")
        fh.flush()
        assert f.poll(0) == []  # the XID line has no newline yet
        fh.write("E\n")
    [ev] = f.poll(0)
    assert (ev.code, ev.device) == ("48", "0000:64:00") and ev.message.endswith("DBE")


def test_follower_wakes_as_soon_as_a_line_is_appended(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    f = KernelLogFollower(str(log))

    def later() -> None:
        time.sleep(0.2)
        with open(log, "a") as fh:
            fh.write("NEURON_HW_ERR=DMA_ERROR instance-id=i-1 nd-id=2 action=TERMINATE_INSTANCE\n")

    threading.Thread(target=later).start()
    t0 = time.monotonic()
    [ev] = f.poll(5)
    assert ev.vendor == "neuron" and ev.device == "nd2" and time.monotonic() - t0 < 2


def test_follower_starts_over_when_the_file_is_truncated(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("x" * 500 + "\n")
    f = KernelLogFollower(str(log))
    log.write_text("NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus.\n")
    assert [e.code for e in f.poll(0)] == ["79"]


def test_read_kernel_log_falls_back_to_dmesg_command(tmp_path: Path) -> None:
    lines, source = read_kernel_log(str(tmp_path / "no-kmsg"), dmesg="echo")
    assert source == "echo" and lines == [""]


def test_follower_joins_the_off_bus_report_across_polls_and_ignores_audit_lines(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    f = KernelLogFollower(str(log))
    lines = (FIXTURES / "kmsg-fallen-off-bus-570.txt").read_text().splitlines(True)
    hostile = (FIXTURES / "kmsg-hostile.txt").read_text()
    with open(log, "a") as fh:
        fh.write(hostile + "".join(lines[:2]))
    assert f.poll(0) == []  # the head of the report alone, and nothing from the audit records
    with open(log, "a") as fh:
        fh.write("".join(lines[2:]))
    [ev] = f.poll(0)
    assert (ev.vendor, ev.code, ev.device) == ("nvidia", "79", "0000:c4:00")
