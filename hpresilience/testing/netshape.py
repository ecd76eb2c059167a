"""A netns devcluster node's link bandwidth (`devcluster slow NODE --rate R`): tbf on both ends of its veth pair.

netem (a delay) is a kernel module that many kernels lack (`devcluster slow --delay-ms` says so in one line); tbf,
the token bucket filter, is built into nearly all of them and works inside a network namespace. A tbf root qdisc on
the node's bridge port (what the node receives) and on its own eth0 (what it sends) caps the node's traffic at the
rate each way: a transfer-bound step there takes longer than on the others, as behind a slow or congested link.
A link has one root qdisc: a rate replaces a delay and a delay a rate; `--rate 0` removes it.

The command building and the rate's parsing are pure functions (unit-tested); `limit` runs them.
"""

from __future__ import annotations

import re

from hpresilience import proc
from hpresilience.errors import ConfigError
from hpresilience.testing.netns import IP_TIMEOUT_S, NODE_IF, NetnsError, _known, bridge_port, ctl_ns, node_ns

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)?$")
_UNIT = {"bit": 1, "kbit": 1000, "mbit": 1000**2, "gbit": 1000**3}  # tc's units: SI, in bits per second
MIN_BPS = 8_000  # below 1 kB/s even Slurm's own messages time out: a cut link is `partition`
MAX_BPS = 100 * 1000**3
LATENCY = "400ms"  # how long a packet may wait in the bucket before tbf drops it (TCP then backs off, as on a WAN)
MIN_BURST = 4000  # bytes: at least a full frame, and tbf's burst must hold what the kernel sends per timer tick


def parse_rate(text: str) -> int:
    """`1mbit`, `500kbit`, `2gbit`, `64000` (bits per second, tc's units) -> bits per second; `0` -> 0 (remove).
    Raises ConfigError naming the forms it takes."""
    m = _RATE.match(text.strip().lower())
    if m is None:
        raise ConfigError(f"--rate {text!r} is not a rate: a number with bit, kbit, mbit or gbit (1mbit), or 0")
    bps = round(float(m.group(1)) * _UNIT[m.group(2) or "bit"])
    if bps != 0 and not MIN_BPS <= bps <= MAX_BPS:
        raise ConfigError(f"--rate must be 0 (remove) or from 8kbit to 100gbit, not {text!r}")
    return bps


def burst_bytes(bps: int) -> int:
    """10 ms of the rate, never under one frame's worth (tbf refuses a bucket smaller than rate/HZ)."""
    return max(MIN_BURST, bps // 8 // 100)


def tbf_argv(ns: str, dev: str, bps: int) -> list[str]:
    """The tc command capping `dev` (in namespace `ns`) at `bps` bits per second."""
    return [
        "tc", "-n", ns, "qdisc", "replace", "dev", dev, "root",
        "tbf", "rate", f"{bps}bit", "burst", str(burst_bytes(bps)), "latency", LATENCY,
    ]  # fmt: skip


def clear_argv(ns: str, dev: str) -> list[str]:
    return ["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"]


def ends(base_port: int, node: str) -> list[tuple[str, str]]:
    """(namespace, device) of both ends of the node's link: its bridge port in ctl and its own eth0."""
    return [(ctl_ns(base_port), bridge_port(node)), (node_ns(base_port, node), NODE_IF)]


def already_clear(stderr: str) -> bool:
    """Whether a failed `qdisc del` failed only because the link had no qdisc of ours."""
    return "No such file" in stderr or "Cannot delete qdisc with handle of zero" in stderr


def limit(base_port: int, node: str, bps: int) -> None:
    """Cap the node's link at `bps` each way (tbf on both ends); 0 removes the cap (or a netem delay)."""
    _known(base_port, node)
    for ns, dev in ends(base_port, node):
        argv = tbf_argv(ns, dev, bps) if bps else clear_argv(ns, dev)
        res = proc.run(argv, IP_TIMEOUT_S)
        if not res.ok and not (bps == 0 and already_clear(res.stderr)):
            raise NetnsError(f"`{' '.join(argv)}` failed: {res.stderr.strip()[:300] or res.describe()}")


def shown(base_port: int, node: str) -> list[str]:
    """`tc qdisc show` of both ends of the node's link, one line each (for tests and status)."""
    out = []
    for ns, dev in ends(base_port, node):
        res = proc.run(["tc", "-n", ns, "qdisc", "show", "dev", dev, "root"], IP_TIMEOUT_S)
        out.append(res.stdout.strip())
    return out
