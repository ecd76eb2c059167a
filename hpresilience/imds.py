"""EC2 instance metadata (IMDSv2): the one client of the node agent's notice source (agent/imds.py) and the training
library's spot poll (torch/preemption.py).

    PUT  /latest/api/token                               X-aws-ec2-metadata-token-ttl-seconds: 60
    GET  <path>                                          X-aws-ec2-metadata-token: <token>; 404: no such document

Plain HTTP from the standard library (the training library takes no dependency for it). Each request ends
within `timeout_s` in all (connect, send, status line, headers, body), however slowly the endpoint trickles
its answer, and reads at most MAX_BODY bytes of body; whatever goes wrong is `MetadataUnavailable`. Not bounded
by it: a host *name*'s lookup (getaddrinfo has no timeout), so the endpoint is an address (the default
169.254.169.254). What the documents mean is each caller's: the agent reads them into notices, the library
into a reason to stop.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.parse
from typing import Any

from hpresilience.errors import ConfigError, HPResilienceError

TOKEN_PATH = "/latest/api/token"
SPOT_PATH = "/latest/meta-data/spot/instance-action"
EVENTS_PATH = "/latest/meta-data/events/maintenance/scheduled"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_BODY = 64 * 1024  # real answers are a few hundred bytes
MAX_TOKEN = 1024


class MetadataUnavailable(HPResilienceError):
    """The endpoint did not answer a request whole and in time (refused, timed out, an HTTP error, too long)."""


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


class MetadataClient:
    """IMDSv2 at `endpoint` (http://HOST[:PORT]): a session token, then documents read with it."""

    def __init__(self, endpoint: str, timeout_s: float, setting: str = "ec2 metadata endpoint") -> None:
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme != "http" or not url.hostname:
            raise ConfigError(f"{setting}: {endpoint!r} is not http://HOST[:PORT]")
        self.host = url.hostname
        self.port = url.port or 80
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
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
                    raise MetadataUnavailable(f"{path}: answer larger than {MAX_BODY} bytes")
        except TimeoutError:  # some step ran into the deadline (the socket's timeout is what is left of it)
            raise MetadataUnavailable(f"{method} {path}: no whole answer within {self.timeout_s} s") from None
        except (OSError, ValueError, http.client.HTTPException) as err:  # ValueError: a header it would not send
            raise MetadataUnavailable(f"{method} {path}: {type(err).__name__}: {err}") from None
        finally:
            conn.close()

    def token(self) -> str:
        """A session token (IMDSv2), valid for 60 s: every GET of one poll carries it."""
        status, token = self.request("PUT", TOKEN_PATH, {TOKEN_TTL_HEADER: "60"})
        if status != 200 or not token or len(token) > MAX_TOKEN:
            raise MetadataUnavailable(f"PUT {TOKEN_PATH}: HTTP {status}")
        return token.decode("ascii", "replace").strip()

    def get(self, path: str, token: str) -> bytes | None:
        """The document at `path`, or None when there is none (404: e.g. no spot action scheduled)."""
        status, body = self.request("GET", path, {TOKEN_HEADER: token})
        if status == 404:
            return None
        if status != 200:
            raise MetadataUnavailable(f"GET {path}: HTTP {status}")
        return body
