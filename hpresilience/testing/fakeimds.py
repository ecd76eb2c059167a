"""A local EC2 instance metadata server (IMDSv2) that announces spot reclaims and scheduled maintenance.

Real HTTP on loopback, with IMDSv2's token rules: `PUT /latest/api/token` with a TTL header (1..21600 s)
gives a token; a GET without a valid, unexpired token gets 401. What it serves is what the agent reads:

    GET /latest/meta-data/spot/instance-action          404 until announce_spot()
    GET /latest/meta-data/events/maintenance/scheduled  the events announced (a JSON list, EC2's date format)

For tests (`with FakeImds() as imds: imds.announce_spot(); ...`) and for trying the agent by hand:

    python -m hpresilience.testing.fakeimds --port 8169 --spot terminate --in 120
    # agent.notices.ec2_endpoint: http://127.0.0.1:8169
"""

from __future__ import annotations

import argparse
import json
import secrets
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SPOT = "/latest/meta-data/spot/instance-action"
EVENTS = "/latest/meta-data/events/maintenance/scheduled"


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_date(epoch: float) -> str:
    """EC2's scheduled-event date: "21 Jan 2019 09:00:43 GMT"."""
    return datetime.fromtimestamp(int(epoch), timezone.utc).strftime("%d %b %Y %H:%M:%S GMT")


class FakeImds:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}  # token -> monotonic expiry
        self._raw: dict[str, bytes] = {}  # path -> body served as is (hostile-input tests)
        self.spot: dict[str, str] | None = None
        self.events: list[dict[str, str]] = []
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status): what was asked
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeImds:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-imds", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeImds:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what it announces -------------------------------------------------------------------------------
    def announce_spot(self, action: str = "terminate", in_s: float = 120.0) -> None:
        """A spot interruption notice: the instance is reclaimed `in_s` from now (EC2 gives two minutes)."""
        with self._lock:
            self.spot = {"action": action, "time": iso(time.time() + in_s)}

    def announce_maintenance(
        self,
        code: str = "system-reboot",
        description: str = "scheduled reboot",
        in_s: float = 600.0,
        duration_s: float = 3600.0,
    ) -> str:
        """A scheduled event starting `in_s` from now; returns its EventId."""
        event_id = "instance-event-" + secrets.token_hex(8)
        start = time.time() + in_s
        with self._lock:
            self.events.append(
                {
                    "NotBefore": event_date(start),
                    "Code": code,
                    "Description": description,
                    "EventId": event_id,
                    "NotAfter": event_date(start + duration_s),
                    "State": "active",
                }
            )
        return event_id

    def cancel_maintenance(self, event_id: str) -> None:
        """As EC2 does: the event stays listed, State canceled and its Description marked."""
        with self._lock:
            for ev in self.events:
                if ev["EventId"] == event_id:
                    ev["State"] = "canceled"
                    ev["Description"] = "[Canceled] " + ev["Description"]

    def serve_raw(self, path: str, body: bytes) -> None:
        """Serve `body` as is at `path` (a malformed or hostile document)."""
        with self._lock:
            self._raw[path] = body

    def clear(self) -> None:
        with self._lock:
            self.spot = None
            self.events = []
            self._raw = {}

    # -- HTTP ------------------------------------------------------------------------------------------
    def _answer(self, method: str, path: str, headers: Any) -> tuple[int, bytes]:
        with self._lock:
            if method == "PUT":
                if path != "/latest/api/token":
                    return 405, b""
                ttl = headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return 400, b""
                token = secrets.token_urlsafe(32)
                self._tokens[token] = time.monotonic() + int(ttl)
                return 200, token.encode()
            if self._tokens.get(headers.get("X-aws-ec2-metadata-token", ""), 0.0) < time.monotonic():
                return 401, b""
            if path in self._raw:
                return 200, self._raw[path]
            if path == SPOT:
                return (200, json.dumps(self.spot).encode()) if self.spot else (404, b"")
            if path == EVENTS:
                return 200, json.dumps(self.events, indent=2).encode()
            return 404, b""

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                status, body = imds._answer(method, self.path, self.headers)
                imds.requests.append((method, self.path, status))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._reply("GET")

            def do_PUT(self) -> None:
                self._reply("PUT")

            def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read their own logs
                pass

        return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hpresilience.testing.fakeimds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8169)
    ap.add_argument("--spot", choices=("terminate", "stop", "hibernate"), help="announce a spot interruption")
    ap.add_argument("--maintenance", metavar="CODE", help="announce a scheduled event (e.g. system-reboot)")
    ap.add_argument("--in", dest="in_s", type=float, default=120.0, help="seconds until it happens")
    args = ap.parse_args(argv)
    imds = FakeImds(args.host, args.port)
    if args.spot:
        imds.announce_spot(args.spot, args.in_s)
    if args.maintenance:
        imds.announce_maintenance(args.maintenance, in_s=args.in_s)
    print(f"fake instance metadata at {imds.url} (Ctrl-C to stop)", flush=True)
    try:
        imds._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        imds._server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
