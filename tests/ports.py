"""A free TCP port on localhost for a server a test starts (moto, a TCPStore): the kernel's pick, so parallel
workers never collide."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
