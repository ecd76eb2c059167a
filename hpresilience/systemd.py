"""sd_notify without a dependency: READY=1, WATCHDOG=1 and STATUS= for Type=notify units.

A no-op when not started by systemd (NOTIFY_SOCKET unset), so daemons call it unconditionally.
"""

from __future__ import annotations

import os
import socket


def notify(*states: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall("\n".join(states).encode())
        return True
    except OSError:
        return False


def watchdog_interval_s() -> float | None:
    """Half of systemd's WatchdogSec, the recommended ping period; None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec or not usec.isdigit():
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2e6
