"""EFA: devices vs the profile, port state, uverbs nodes, `fi_info -p efa`, hw_counters rates, loopback."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import Field

from hpresilience import proc
from hpresilience.health.base import (
    Check,
    CheckContext,
    CheckOptions,
    CheckResult,
    Kind,
    Status,
    read_int,
    read_text,
    register,
)
from hpresilience.health.checks.common import load_json, save_json
from hpresilience.proc import resolve
from hpresilience.reasons import Action

AMAZON_VENDOR = "0x1d0f"
# Per-second limits (EKS node monitoring agent's token buckets); the event counters matter, bytes do not.
DEFAULT_RATES = {
    "rx_drops": 100.0,
    "rdma_read_wr_err": 100.0,
    "rdma_write_wr_err": 100.0,
    "unresponsive_remote_events": 100.0,
    "impaired_remote_conn_events": 100.0,
    "retrans_timeout_events": 100.0,
    "retrans_pkts": 1000.0,
    "cmds_err": 100.0,
}


def efa_devices(ctx: CheckContext) -> list[Path]:
    out = []
    for dev in ctx.paths.glob(ctx.paths.sys("class", "infiniband"), "*"):
        driver = dev / "device" / "driver"
        drv = os.path.basename(os.readlink(driver)) if driver.is_symlink() else ""
        if drv == "efa" or read_text(dev / "device" / "vendor") == AMAZON_VENDOR:
            out.append(dev)
    return out


class EfaDevicesOptions(CheckOptions):
    expected: int | None = Field(default=None, ge=0)


@register
class EfaDevices(Check[EfaDevicesOptions]):
    """EFA device count, port state ACTIVE, and one uverbs node per device."""

    name = "efa.devices"
    family = "efa"
    Options = EfaDevicesOptions

    def run(self) -> CheckResult:
        devs = efa_devices(self.ctx)
        expected = self.options.expected if self.options.expected is not None else self.ctx.expect.efa_devices
        if not devs and not expected:
            return self.absent("no EFA devices")
        problems = []
        ports = {}
        for d in devs:
            for port in self.ctx.paths.glob(d / "ports", "*"):
                state = read_text(port / "state") or "?"
                ports[f"{d.name}/{port.name}"] = state
                if "ACTIVE" not in state:
                    problems.append(f"{d.name} port {port.name} state {state!r}")
        uverbs = self.ctx.paths.glob(self.ctx.paths.device("infiniband"), "uverbs*")
        ev = {
            "found": len(devs),
            "expected": expected,
            "devices": [d.name for d in devs],
            "ports": ports,
            "uverbs": len(uverbs),
        }
        if expected is not None and len(devs) < expected:
            return self.fail(
                f"{len(devs)} EFA device(s), profile expects {expected}",
                Action.REBOOT,
                "efa.count",
                False,
                evidence=ev,
            )
        if len(uverbs) < len(devs):
            problems.append(f"{len(uverbs)} /dev/infiniband/uverbs* node(s) for {len(devs)} device(s)")
        if problems:
            return self.fail("; ".join(problems)[:300], Action.REBOOT, "efa.devices", False, evidence=ev)
        return self.ok(f"{len(devs)} EFA device(s), ports active", evidence=ev)


@register
class EfaFiInfo(Check[CheckOptions]):
    """libfabric sees the EFA provider (`fi_info -p efa` exits 0 and lists it)."""

    name = "efa.fi_info"
    family = "efa"

    def run(self) -> CheckResult:
        if not efa_devices(self.ctx) and not self.ctx.expect.efa_devices:
            return self.absent("no EFA devices")
        exe = resolve(self.ctx.command("fi_info"))
        if exe is None:
            return self.absent("fi_info (libfabric) not installed")
        res = proc.run([exe, "-p", "efa"], self.timeout_s - 1)
        if res.timed_out:
            return self.result(Status.UNKNOWN, res.describe())
        if not res.ok or "provider: efa" not in res.stdout:
            return self.fail(
                f"libfabric does not offer the EFA provider: {res.describe()}",
                Action.REBOOT,
                "efa.fi_info",
                False,
                stdout=res.stdout[-500:],
                stderr=res.stderr[-500:],
            )
        return self.ok("fi_info lists the efa provider", endpoints=res.stdout.count("provider: efa"))


class EfaCountersOptions(CheckOptions):
    rates: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_RATES))


def read_counters(dev: Path) -> dict[str, int]:
    out = {}
    for hw in [dev / "hw_counters", *sorted((dev / "ports").glob("*/hw_counters"))]:
        prefix = "" if hw.parent == dev else f"port{hw.parent.name}/"
        for f in sorted(hw.glob("*")) if hw.is_dir() else []:
            v = read_int(f)
            if v is not None:
                out[prefix + f.name] = v
    return out


@register
class EfaCounters(Check[EfaCountersOptions]):
    """Error-counter rates since the previous sample (kept on disk); counters are cumulative: deltas only."""

    name = "efa.counters"
    family = "efa"
    Options = EfaCountersOptions

    def run(self) -> CheckResult:
        devs = efa_devices(self.ctx)
        if not devs:
            return self.absent("no EFA devices")
        now = time.time()
        sample = {f"{d.name}/{k}": v for d in devs for k, v in read_counters(d).items()}
        path = self.ctx.state_path("efa-counters.json")
        prev = load_json(path)
        save_json(path, {"time": now, "counters": sample})
        prev_counters: dict[str, int] = prev.get("counters", {})
        elapsed = now - float(prev.get("time", now))
        if not prev_counters or elapsed <= 0:
            return self.ok(f"baseline of {len(sample)} counters taken", counters=len(sample))
        over = []
        deltas = {}
        for k, v in sample.items():
            name = k.rsplit("/", 1)[-1]
            if name not in self.options.rates or k not in prev_counters:
                continue
            delta = v - prev_counters[k]
            if delta < 0:  # counter reset (driver reload): no rate this time
                continue
            if delta:
                deltas[k] = delta
            rate = delta / elapsed
            if rate > self.options.rates[name]:
                over.append(f"{k} +{delta} in {elapsed:.0f} s ({rate:.1f}/s > {self.options.rates[name]:g}/s)")
        ev = {"interval_s": round(elapsed, 1), "deltas": deltas}
        if over:
            return self.warn(
                "EFA error counters rising: " + "; ".join(over)[:300],
                key="efa.counters",
                over=over,
                evidence=ev,
            )
        return self.ok(f"{len(sample)} counters within limits", evidence=ev)


class EfaLoopbackOptions(CheckOptions):
    iterations: int = Field(default=100, ge=1)


@register
class EfaLoopback(Check[EfaLoopbackOptions]):
    """`fi_pingpong -p efa` server and client on this node, per device (active: it moves traffic)."""

    name = "efa.loopback"
    family = "efa"
    kind = Kind.ACTIVE
    default_timeout_s = 120.0
    Options = EfaLoopbackOptions

    def run(self) -> CheckResult:
        devs = efa_devices(self.ctx)
        if not devs:
            return self.absent("no EFA devices")
        exe = resolve(self.ctx.command("fi_pingpong"))
        if exe is None:
            return self.absent("fi_pingpong (libfabric) not installed")
        per_dev = max(5.0, (self.timeout_s - 5) / len(devs))
        failed = []
        for d in devs:
            base = [exe, "-p", "efa", "-d", d.name, "-I", str(self.options.iterations)]
            with proc.background(base):
                time.sleep(0.5)
                res = proc.run([*base, "localhost"], per_dev)
            if not res.ok:
                failed.append(f"{d.name}: {res.describe()}")
        if failed:
            return self.fail(
                "EFA loopback failed: " + "; ".join(failed)[:300],
                Action.REBOOT,
                "efa.loopback",
                False,
                failed=failed,
            )
        return self.ok(f"fi_pingpong loopback passed on {len(devs)} device(s)")
