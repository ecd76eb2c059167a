"""InfiniBand HCAs (mlx5 and friends) from /sys/class/infiniband: port state and rate, error-counter growth.

EFA devices live in the same sysfs class; they are the `efa.*` checks' business and are left out here
(by driver or Amazon's PCI vendor), so an mlx5 HCA is never taken for EFA nor EFA for InfiniBand. Ports
whose link layer is not in `link_layers` (RoCE ports say `Ethernet`) are listed but not judged.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from hpresilience.health.base import (
    Check,
    CheckContext,
    CheckOptions,
    CheckResult,
    read_int,
    read_text,
    register,
)
from hpresilience.health.checks.common import finding_dict, load_json, report, save_json
from hpresilience.health.checks.efa import efa_devices
from hpresilience.reasons import Action

# The port error counters (IBA PortCounters) whose growth means a sick link: the link went down, bit
# errors on the wire, bad packets received, or the link had to retrain.
ERROR_COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors", "link_error_recovery")
_RATE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*Gb/sec")


def ib_ports(ctx: CheckContext) -> list[tuple[str, Path]]:
    """(device/port, port dir) of every RDMA port that is not an EFA device's."""
    efa = {d.name for d in efa_devices(ctx)}
    out = []
    for dev in ctx.paths.glob(ctx.paths.sys("class", "infiniband"), "*"):
        if dev.name in efa:
            continue
        for port in ctx.paths.glob(dev / "ports", "*"):
            out.append((f"{dev.name}/{port.name}", port))
    return out


def link_layer(port: Path) -> str:
    return read_text(port / "link_layer") or "InfiniBand"


def rate_gbps(port: Path) -> float | None:
    m = _RATE.match(read_text(port / "rate") or "")
    return float(m.group("n")) if m else None


class IbPortsOptions(CheckOptions):
    # Ports expected up (of the judged link layers); None: whatever is there.
    expected: int | None = Field(default=None, ge=0)
    # Slowest healthy rate, e.g. 400 for NDR, 200 for HDR; None: rate not judged.
    min_rate_gbps: float | None = Field(default=None, gt=0)
    link_layers: list[str] = Field(default_factory=lambda: ["InfiniBand"])
    # A port down may be the cable or the switch, not this node: operators choose whether it reboots.
    down_action: Literal["reboot", "warn"] = "reboot"


@register
class IbPorts(Check[IbPortsOptions]):
    """Every InfiniBand port ACTIVE / LinkUp, at least the profile's rate, and as many as expected."""

    name = "ib.ports"
    family = "infiniband"
    Options = IbPortsOptions

    def run(self) -> CheckResult:
        o = self.options
        ports = ib_ports(self.ctx)
        judged = [(n, p) for n, p in ports if link_layer(p) in o.link_layers]
        if not judged and not o.expected:
            return self.absent("no InfiniBand ports")
        findings: list[CheckResult] = []
        seen = {}
        down_action = Action.REBOOT if o.down_action == "reboot" else Action.NONE
        for name, port in judged:
            state = read_text(port / "state") or "?"
            phys = read_text(port / "phys_state") or "?"
            rate = rate_gbps(port)
            seen[name] = {"state": state, "phys_state": phys, "rate_gbps": rate}
            if "ACTIVE" not in state or ("LinkUp" not in phys and phys != "?"):
                findings.append(
                    self.finding(
                        f"{name} state {state!r}, phys_state {phys!r}",
                        down_action,
                        f"ib.port_down:{name}",
                        False,
                        {"port": name},
                    )
                )
            elif o.min_rate_gbps is not None and rate is not None and rate < o.min_rate_gbps:
                findings.append(
                    self.finding(
                        f"{name} at {rate:g} Gb/s, profile expects at least {o.min_rate_gbps:g}",
                        Action.NONE,
                        f"ib.port_rate:{name}",
                        False,
                        {"port": name, "rate_gbps": rate},
                    )
                )
        if o.expected is not None and len(judged) < o.expected:
            findings.append(
                self.finding(
                    f"{len(judged)} InfiniBand port(s), profile expects {o.expected}",
                    Action.REBOOT,
                    "ib.count",
                    False,
                    {"found": len(judged), "expected": o.expected},
                )
            )
        others = {n: link_layer(p) for n, p in ports if link_layer(p) not in o.link_layers}
        ev = {"ports": seen, "not_judged": others}
        if not findings:
            return self.ok(f"{len(judged)} InfiniBand port(s) active", evidence=ev)
        ev["findings"] = [finding_dict(f) for f in findings]
        return report(findings, ev)


class IbCountersOptions(CheckOptions):
    # Growth between two runs above which a counter is reported (0: any growth).
    max_increase: dict[str, int] = Field(
        default_factory=lambda: {
            "link_downed": 0,
            "symbol_error": 10,
            "port_rcv_errors": 10,
            "link_error_recovery": 0,
        }
    )
    link_layers: list[str] = Field(default_factory=lambda: ["InfiniBand"])

    @field_validator("max_increase")
    @classmethod
    def _known_counters(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(ERROR_COUNTERS))
        if unknown:
            raise ValueError(f"unknown counter(s) {unknown}; known: {list(ERROR_COUNTERS)}")
        if any(n < 0 for n in v.values()):
            raise ValueError("limits must be >= 0")
        return v


@register
class IbCounters(Check[IbCountersOptions]):
    """Growth of link_downed, symbol_error, port_rcv_errors, link_error_recovery since the previous run.

    The counters are cumulative and survive a job (often a reboot too): only their growth between two
    runs of this check says anything, so the first run in a boot takes the baseline. Growth warns; a
    port that stays down is `ib.ports`' failure.
    """

    name = "ib.counters"
    family = "infiniband"
    Options = IbCountersOptions

    def run(self) -> CheckResult:
        o = self.options
        ports = [(n, p) for n, p in ib_ports(self.ctx) if link_layer(p) in o.link_layers]
        if not ports:
            return self.absent("no InfiniBand ports")
        sample: dict[str, int] = {}
        for name, port in ports:
            for c in ERROR_COUNTERS:
                v = read_int(port / "counters" / c)
                if v is not None:
                    sample[f"{name}/{c}"] = v
        path = self.ctx.state_path("ib-counters.json")
        prev = load_json(path)
        boot = self.ctx.boot_id()
        save_json(path, {"boot_id": boot, "counters": sample})
        before: dict[str, int] = prev.get("counters", {}) if prev.get("boot_id") == boot else {}
        if not before:
            return self.ok(f"baseline of {len(sample)} InfiniBand error counters taken", counters=len(sample))
        over, deltas = [], {}
        for k, v in sample.items():
            if k not in before or v < before[k]:  # new port, or counters cleared: no growth to judge
                continue
            delta = v - before[k]
            if delta:
                deltas[k] = delta
            limit = o.max_increase.get(k.rsplit("/", 1)[-1])
            if limit is not None and delta > limit:
                over.append(f"{k} +{delta} (limit {limit})")
        ev = {"deltas": deltas}
        if over:
            return self.warn(
                "InfiniBand error counters rising: " + "; ".join(over)[:300], key="ib.counters", over=over, evidence=ev
            )
        return self.ok(f"{len(sample)} InfiniBand error counters steady", evidence=ev)
