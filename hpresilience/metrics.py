"""Prometheus metrics shared by the daemons and the wrapper, and the small HTTP server that serves them.

Each daemon owns a CollectorRegistry (so tests can run several in one process) and serves
`/metrics` plus `/healthz` on a configurable address (loopback by default). The wrapper, which has no
server, writes its registry to a node_exporter textfile-collector file instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from hpresilience.errors import ConfigError
from hpresilience.fileio import atomic_write
from hpresilience.log import get_logger

_log = get_logger("hpresilience.metrics")


def parse_address(address: str) -> tuple[str, int]:
    """`127.0.0.1:9761`, `:9761` or `[::1]:9761` -> (host, port); a bad one is a ConfigError naming it."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"metrics address {address!r} is not HOST:PORT")
    return (host.strip("[]") or "127.0.0.1"), int(port)


class MetricsServer:
    """Serves /metrics from a registry and /healthz from a callable (True -> 200, False -> 503)."""

    def __init__(self, registry: CollectorRegistry, address: str, healthy: Callable[[], bool] = lambda: True) -> None:
        host, port = parse_address(address)
        reg, ok = registry, healthy

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    body, code, ctype = generate_latest(reg), 200, CONTENT_TYPE_LATEST
                elif self.path.startswith("/healthz"):
                    good = ok()
                    body, code, ctype = (b"ok\n" if good else b"unhealthy\n"), (200 if good else 503), "text/plain"
                else:
                    body, code, ctype = b"not found\n", 404, "text/plain"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> MetricsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def start_metrics_server(
    registry: CollectorRegistry, address: str, healthy: Callable[[], bool], daemon: str
) -> MetricsServer | None:
    """Start the server, or log `metrics_server_not_started` and return None when the address cannot be
    bound (port taken, an address this host lacks): the daemon's checks and repairs matter more than its
    metrics, and a crash here would become a restart loop under systemd's Restart=on-failure."""
    try:
        return MetricsServer(registry, address, healthy).start()
    except OSError as err:  # EADDRINUSE, EADDRNOTAVAIL, EAFNOSUPPORT, gaierror
        _log.error("metrics_server_not_started", daemon=daemon, address=address, error=str(err.strerror or err))
        return None


def write_textfile(registry: CollectorRegistry, path: str) -> None:
    """Atomically write the registry for node_exporter's textfile collector (`*.prom`); world-readable, as
    node_exporter usually runs as a user of its own."""
    atomic_write(path, generate_latest(registry), mode=0o644)
