"""A loopback HTTP endpoint that never finishes its answer: what a per-read timeout does not bound.

Shared by the metadata tests (the agent's notice source, the training library's spot poll, the client both use)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

LENGTHY = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"  # a body promised and never all sent


@contextlib.contextmanager
def trickling_endpoint(
    head: bytes = LENGTHY, byte: bytes = b"x", every_s: float = 0.2, for_s: float = 8.0
) -> Iterator[str]:
    """Yields `http://127.0.0.1:PORT`: each connection's request is read, `head` sent, then `byte` every `every_s`
    (never the end of what `head` began), for at most `for_s` in all; connections are taken one after the other."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(2)
    stop = threading.Event()
    until = time.monotonic() + for_s

    def trickle() -> None:
        while not stop.is_set() and time.monotonic() < until:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.recv(4096)
            conn.sendall(head)
            while not stop.is_set() and time.monotonic() < until:
                try:
                    conn.sendall(byte)
                except OSError:
                    break
                time.sleep(every_s)
            conn.close()

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        srv.close()
        t.join(timeout=every_s + 2)
