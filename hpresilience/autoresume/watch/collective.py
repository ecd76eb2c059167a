"""Collective failures: the signatures of a collective timeout or abort in a step's output.

A step whose ranks lost a collective (NCCL's watchdog timeout then SIGABRT, gloo's lost connection or
recv timeout, a torch.distributed store timeout) exits like any crash: torchrun turns the worker's abort
into exit code 1. The signature is in the output, not in the exit code. With every node healthy after a
settle window, such a step is relaunched on the same nodes up to `collective_retries` times per
evaluation period; a node implicated twice is a suspect, handled as a hang's culprit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

# The lines torch, NCCL and gloo print when a collective is lost, each as its source writes it (ProcessGroupNCCL.cpp,
# gloo/transport/tcp, TCPStore.cpp, the store's Python wrapper). Patterns are case-sensitive and anchored on
# the message's fixed words and numbers: a loose word pair reads benign lines as failures (issue 32: "Using
# TCPStore with timeout 1800 seconds" was a store timeout, "no NCCL errors so far" an NCCL abort), and one
# such line anywhere in an attempt turns a later application error into a same-node relaunch.
# The literal is a substring every match contains: the per-line cost stays a substring test.
SIGNATURES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    (
        "nccl_watchdog",
        "Watchdog caught collective operation timeout",
        # [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, ...)
        re.compile(r"Watchdog caught collective operation timeout: Work\w*\("),
    ),
    # NCCL communicator was aborted on rank 3. Original reason for failure was: ...
    ("nccl_abort", "NCCL communicator was aborted", re.compile(r"NCCL communicator was aborted on rank \d+")),
    # torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp:1970, unhandled system error
    ("nccl_abort", "NCCL error in: ", re.compile(r"NCCL error in: \S+:\d+, \S")),
    (
        "nccl_abort",
        "Some NCCL operations have failed or timed out",
        re.compile(r"Some NCCL operations have failed or timed out"),
    ),
    (
        "nccl_abort",
        "watchdog thread terminated with exception",
        re.compile(r"(?:Process group|NCCL) watchdog thread terminated with exception"),
    ),
    (
        "nccl_abort",
        "watchdog got stuck for",
        re.compile(r"ProcessGroupNCCL's watchdog got stuck for \d+ seconds"),
    ),
    # RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234
    # ... pair.cc:598] Read error [10.0.0.2]:1234: Connection reset by peer
    (
        "gloo_connection",
        "by peer",
        re.compile(
            r"gloo/transport/\w+/\w+\.cc:\d+\] (?:Connection closed by peer|Read error .*: Connection reset by peer)"
        ),
    ),
    # [.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 60000ms for recv operation to complete
    ("gloo_timeout", "Timed out waiting", re.compile(r"Timed out waiting \d+ms for (?:recv|send) operation")),
    # torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.
    (
        "store_timeout",
        "waiting for clients",
        re.compile(r"Timed out after \d+ seconds waiting for clients\. \d+/\d+ clients joined"),
    ),
    # torch.distributed.DistStoreError: wait timeout after 300000ms, keys: /default_pg/0//cuda//0
    ("store_timeout", "wait timeout after", re.compile(r"[Ww]ait timeout after \d+ms, keys: ")),
    # (older TCPStore) RuntimeError: Timeout waiting for key: default_pg/0/0 / RuntimeError: Socket Timeout
    ("store_timeout", "Timeout waiting for key: ", re.compile(r"Timeout waiting for key: \S")),
    ("store_timeout", "Socket Timeout", re.compile(r"(?:Error|Exception): Socket Timeout\b")),
    # torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to
    # connect to (10.0.0.1, 29500).
    (
        "store_timeout",
        "socket has timed out after",
        re.compile(r"The client socket has timed out after \S+ while trying to connect to \("),
    ),
)


@dataclass(frozen=True)
class Signature:
    kind: str
    task: int | None
    line: str
    at: float


def match_signature(body: str) -> str | None:
    """The kind of collective failure a line shows, or None."""
    for kind, literal, pattern in SIGNATURES:
        if literal in body and pattern.search(body):
            return kind
    return None


class CollectiveBudget:
    """Relaunches for collective failures within the policy's evaluation period, and nodes implicated."""

    def __init__(self, retries: int, period_s: float, clock: Callable[[], float] = time.time) -> None:
        self.retries = retries
        self.period_s = period_s
        self.clock = clock
        self.times: list[float] = []
        self.implicated: dict[str, int] = {}

    def allow(self) -> bool:
        now = self.clock()
        self.times = [t for t in self.times if t > now - self.period_s]
        if len(self.times) >= self.retries:
            return False
        self.times.append(now)
        return True

    def implicate(self, node: str) -> int:
        """Count one more collective failure that names `node`; returns how many so far."""
        self.implicated[node] = self.implicated.get(node, 0) + 1
        return self.implicated[node]
