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

# Literal first words keep the per-line cost to a substring test; the regexes run only on candidates.
SIGNATURES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    (
        "nccl_watchdog",
        "Watchdog caught collective operation timeout",
        re.compile(r"Watchdog caught collective operation timeout"),
    ),
    (
        "nccl_abort",
        "NCCL",
        re.compile(
            r"NCCL communicator was aborted|ProcessGroupNCCL.*(?:timed out|watchdog)"
            r"|NCCL error",
            re.IGNORECASE,
        ),
    ),
    ("gloo_connection", "by peer", re.compile(r"Connection (?:closed|reset) by peer")),
    ("gloo_timeout", "Timed out waiting", re.compile(r"Timed out waiting \d+ms for (?:recv|send) operation")),
    (
        "store_timeout",
        "out",
        re.compile(
            r"(?:DistStoreError|TCPStore|[Ss]tore).{0,120}(?:[Tt]imed out|[Tt]imeout)"
            r"|[Ss]ocket [Tt]imeout"
        ),
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
