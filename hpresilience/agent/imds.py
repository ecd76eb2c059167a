"""The EC2 notice source: spot interruptions and scheduled events from instance metadata (IMDSv2).

    PUT  /latest/api/token                               X-aws-ec2-metadata-token-ttl-seconds: 60
    GET  /latest/meta-data/spot/instance-action          404: none; {"action": "terminate", "time": "...Z"}
    GET  /latest/meta-data/events/maintenance/scheduled  [{"Code", "Description", "EventId", "NotBefore",
                                                           "NotAfter", "State"}], NotBefore "21 Jan 2019 09:00:43 GMT"
Both GETs carry the token (X-aws-ec2-metadata-token). A spot action is a reclaim due at its `time`; a scheduled
event is a maintenance due at its NotBefore, unless it is completed or canceled (State, or a Description that
starts with "[Completed]"/"[Canceled]", as EC2 keeps them listed for a week). Parsers are pure; an entry that
does not parse (or a hostile one: an unknown action, a date out of range, text that is not JSON) is skipped
and logged. An answer over 64 KiB is not read on: that poll fails (NoticeUnavailable, which the watcher
takes as no news, never as a withdrawal).
Each of a poll's three requests ends within `timeout_s` in all (connect, send, status line, headers, body),
however slowly the endpoint trickles its answer, so a poll takes at most 3 x timeout_s. Not bounded by it: a
host *name*'s lookup (getaddrinfo has no timeout), so the endpoint is an address (the default 169.254.169.254).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.parse
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from hpresilience.agent.notices import Notice, NoticeUnavailable
from hpresilience.agent.settings import NoticeSettings
from hpresilience.errors import ConfigError
from hpresilience.log import get_logger
from hpresilience.reasons import PlannedKind

log = get_logger("hpresilience.agent")

TOKEN_PATH = "/latest/api/token"
SPOT_PATH = "/latest/meta-data/spot/instance-action"
EVENTS_PATH = "/latest/meta-data/events/maintenance/scheduled"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_BODY = 64 * 1024  # real answers are a few hundred bytes
SPOT_ACTIONS = ("terminate", "stop", "hibernate")
DONE_STATES = ("completed", "canceled", "cancelled")
_CODE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def _date(text: Any) -> float | None:
    """Epoch seconds of an IMDS date: ISO 8601 UTC ("2026-11-25T20:10:00Z") or the events' "21 Jan 2019
    09:00:43 GMT"; None for anything else or a year out of 2000..2200."""
    if not isinstance(text, str) or len(text) > 40:
        return None
    s = text.strip()
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ", "%d %b %Y %H:%M:%S GMT", "%d %b %Y %H:%M:%S %Z"):
        try:
            at = datetime.strptime(s, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
        return at.timestamp() if 2000 <= at.year <= 2200 else None
    return None


def _clean(text: Any, limit: int = 80) -> str:
    """One short printable line of metadata text, for a Slurm reason."""
    out = _PRINTABLE.sub(" ", text if isinstance(text, str) else "")
    out = " ".join(out.split())
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _json(body: bytes | str, what: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        log.warning(
            "notice_unreadable",
            source="ec2",
            what=what,
            error=str(err)[:120],
            body=_clean(body[:200] if isinstance(body, str) else body[:200].decode("latin-1"), 200),
        )
        return None


def parse_instance_action(body: bytes | str) -> list[Notice]:
    """`spot/instance-action` -> one reclaim notice, or none when the document does not parse."""
    doc = _json(body, "spot/instance-action")
    if doc is None:
        return []
    action = doc.get("action") if isinstance(doc, dict) else None
    at = _date(doc.get("time")) if isinstance(doc, dict) else None
    if action not in SPOT_ACTIONS or at is None:
        log.warning(
            "notice_skipped",
            source="ec2",
            what="spot/instance-action",
            why="expected {action: terminate|stop|hibernate, time: ISO 8601 UTC}",
            doc=_clean(str(doc), 200),
        )
        return []
    return [Notice(PlannedKind.RECLAIM, at, f"ec2 spot {action}", "ec2", f"spot:{action}:{int(at)}")]


def parse_scheduled_events(body: bytes | str) -> list[Notice]:
    """`events/maintenance/scheduled` -> a maintenance notice per event that is still to come."""
    doc = _json(body, "events/maintenance/scheduled")
    if isinstance(doc, dict):
        doc = [doc]  # a single object where a list is documented: read it as a list of one
    if not isinstance(doc, list):
        if doc is not None:
            log.warning("notice_skipped", source="ec2", what="events/maintenance/scheduled", why="not a list")
        return []
    out: list[Notice] = []
    for ev in doc[:50]:
        if not isinstance(ev, dict):
            log.warning("notice_skipped", source="ec2", what="scheduled event", why="not an object")
            continue
        state = ev.get("State")
        desc = _clean(ev.get("Description"))
        if (isinstance(state, str) and state.strip().lower() in DONE_STATES) or desc.lower().startswith(
            ("[completed]", "[canceled]", "[cancelled]")
        ):
            continue
        code = ev.get("Code")
        at = _date(ev.get("NotBefore"))
        if not isinstance(code, str) or not _CODE.match(code) or at is None:
            log.warning(
                "notice_skipped",
                source="ec2",
                what="scheduled event",
                why="expected Code (e.g. system-reboot) and NotBefore ('21 Jan 2019 09:00:43 GMT')",
                entry=_clean(str(ev), 200),
            )
            continue
        key = _clean(ev.get("EventId"), 64) or f"{code}:{int(at)}"
        detail = f"ec2 {code}: {desc}" if desc else f"ec2 {code}"
        out.append(Notice(PlannedKind.MAINTENANCE, at, detail, "ec2", key))
    return out


class _DeadlineSocket(socket.socket):
    """A socket whose every send and receive may take only what is left of one deadline.

    http.client reads the status line and each header line with reads of their own, and a socket timeout
    bounds one read: a server sending a byte just inside timeout_s each time held a `timeout_s=1` request
    for as long as it kept going (issue 31: 29 s). Arming the timeout from the deadline before each call
    bounds the whole request instead.
    """

    deadline = 0.0

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.settimeout(left)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._arm()
        return super().recv(bufsize, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._arm()  # since Python 3.5 the timeout bounds the whole sendall, not each part
        super().sendall(data, flags)


class _DeadlineConnection(http.client.HTTPConnection):
    """An HTTP connection whose socket is a _DeadlineSocket: connect, send and every read end by `deadline`."""

    def __init__(self, host: str, port: int, deadline: float) -> None:
        super().__init__(host, port, timeout=max(0.001, deadline - time.monotonic()))
        self.deadline = deadline

    def connect(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        plain = socket.create_connection((self.host, self.port), left)
        sock = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        sock.deadline = self.deadline
        self.sock = sock


class Ec2NoticeSource:
    """IMDSv2: a session token, then the two documents. Raises NoticeUnavailable when the endpoint is not there."""

    name = "ec2"

    def __init__(self, settings: NoticeSettings) -> None:
        url = urllib.parse.urlsplit(settings.ec2_endpoint)
        if url.scheme != "http" or not url.hostname:
            raise ConfigError(f"agent.notices.ec2_endpoint: {settings.ec2_endpoint!r} is not http://HOST[:PORT]")
        self.host = url.hostname
        self.port = url.port or 80
        self.timeout_s = settings.timeout_s

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """One request, done within timeout_s in all (connect, send, status line, headers, body), and at most
        MAX_BODY bytes of body."""
        deadline = time.monotonic() + self.timeout_s
        conn = _DeadlineConnection(self.host, self.port, deadline)
        try:
            conn.request(method, path, headers=headers)
            resp = conn.getresponse()
            body = b""
            while True:
                chunk = resp.read1(4096)
                if not chunk:
                    return resp.status, body
                body += chunk
                if len(body) > MAX_BODY:
                    raise NoticeUnavailable(f"{path}: answer larger than {MAX_BODY} bytes")
        except TimeoutError:  # some step ran into the deadline (the socket's timeout is what is left of it)
            raise NoticeUnavailable(f"{method} {path}: no whole answer within {self.timeout_s} s") from None
        except (OSError, ValueError, http.client.HTTPException) as err:  # ValueError: a header it would not send
            raise NoticeUnavailable(f"{method} {path}: {type(err).__name__}: {err}") from None
        finally:
            conn.close()

    def _get(self, path: str, token: str) -> bytes | None:
        status, body = self._request("GET", path, {TOKEN_HEADER: token})
        if status == 404:
            return None
        if status != 200:
            raise NoticeUnavailable(f"GET {path}: HTTP {status}")
        return body

    def poll(self) -> Sequence[Notice]:
        status, token = self._request("PUT", TOKEN_PATH, {TOKEN_TTL_HEADER: "60"})
        if status != 200 or not token or len(token) > 1024:
            raise NoticeUnavailable(f"PUT {TOKEN_PATH}: HTTP {status}")
        text = token.decode("ascii", "replace").strip()
        found: list[Notice] = []
        spot = self._get(SPOT_PATH, text)
        if spot is not None:
            found += parse_instance_action(spot)
        events = self._get(EVENTS_PATH, text)
        if events is not None:
            found += parse_scheduled_events(events)
        return found
