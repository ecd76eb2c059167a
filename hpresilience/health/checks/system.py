"""CPU and system: online CPUs, memory, disk space, required mounts, and a stress-ng run (active)."""

from __future__ import annotations

import os

import psutil
from pydantic import Field

from hpresilience import proc
from hpresilience.health.base import (
    Check,
    CheckOptions,
    CheckResult,
    Kind,
    Status,
    read_text,
    register,
)
from hpresilience.proc import resolve
from hpresilience.reasons import Action


def parse_cpu_list(text: str) -> int:
    """Count CPUs in a sysfs list such as `0-95` or `0-3,8,10-11`."""
    n = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return n


class CpuOptions(CheckOptions):
    expected: int | None = Field(default=None, ge=1)


@register
class Cpu(Check[CpuOptions]):
    """Online CPUs vs the profile (a CPU the kernel took offline after machine checks shows here)."""

    name = "system.cpu"
    family = "system"
    Options = CpuOptions

    def run(self) -> CheckResult:
        text = read_text(self.ctx.paths.sys("devices", "system", "cpu", "online"))
        if text is None:
            return self.result(Status.UNKNOWN, "cannot read devices/system/cpu/online")
        online = parse_cpu_list(text)
        exp = self.options.expected
        if exp is not None and online < exp:
            return self.fail(
                f"{online} CPUs online, profile expects {exp}",
                Action.REBOOT,
                "system.cpu",
                False,
                online=online,
                expected=exp,
                list=text,
            )
        return self.ok(f"{online} CPUs online", online=online, expected=exp)


class MemoryOptions(CheckOptions):
    # A DIMM that failed training shrinks MemTotal: fail under this many GiB (None: not judged).
    min_total_gib: float | None = Field(default=None, gt=0)
    min_available_fraction: float = Field(default=0.05, ge=0, le=1)


def read_meminfo(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        k, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[k.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


@register
class Memory(Check[MemoryOptions]):
    name = "system.memory"
    family = "system"
    Options = MemoryOptions

    def run(self) -> CheckResult:
        text = read_text(self.ctx.paths.proc("meminfo"))
        if text is not None:
            info = read_meminfo(text)
            total, avail = info.get("MemTotal", 0), info.get("MemAvailable", info.get("MemFree", 0))
        else:
            vm = psutil.virtual_memory()
            total, avail = int(vm.total), int(vm.available)
        if total <= 0:
            return self.result(Status.UNKNOWN, "meminfo has no MemTotal")
        gib = total / 2**30
        ev = {"total_gib": round(gib, 2), "available_gib": round(avail / 2**30, 2)}
        if self.options.min_total_gib is not None and gib < self.options.min_total_gib:
            return self.fail(
                f"{gib:.1f} GiB of memory, profile expects at least {self.options.min_total_gib:g}",
                Action.REBOOT,
                "system.memory_total",
                False,
                evidence=ev,
            )
        if avail / total < self.options.min_available_fraction:
            return self.warn(f"only {avail / 2**30:.1f} GiB of {gib:.1f} GiB memory available", evidence=ev)
        return self.ok(f"{gib:.1f} GiB memory, {avail / 2**30:.1f} GiB available", evidence=ev)


class DiskOptions(CheckOptions):
    paths: list[str] = Field(default_factory=lambda: ["/", "/tmp"])
    min_free_fraction: float = Field(default=0.05, ge=0, le=1)
    min_free_gib: float = Field(default=1.0, ge=0)


@register
class Disk(Check[DiskOptions]):
    """Free space where jobs and checkpoints write (full disks fail jobs, not hardware: a warning)."""

    name = "system.disk"
    family = "system"
    Options = DiskOptions

    def run(self) -> CheckResult:
        low, usage = [], {}
        for p in self.options.paths:
            try:
                u = psutil.disk_usage(p)
            except OSError as err:
                low.append(f"{p}: {err.strerror or err}")
                continue
            free_gib = u.free / 2**30
            usage[p] = {"free_gib": round(free_gib, 2), "used_percent": u.percent}
            if u.total and (u.free / u.total < self.options.min_free_fraction or free_gib < self.options.min_free_gib):
                low.append(f"{p}: {free_gib:.1f} GiB free ({100 - u.percent:.0f}%)")
        if low:
            return self.warn("low disk space: " + "; ".join(low), key="system.disk", usage=usage)
        return self.ok(f"{len(usage)} path(s) have space", usage=usage)


class MountsOptions(CheckOptions):
    mountpoints: list[str] = Field(default_factory=list)


@register
class Mounts(Check[MountsOptions]):
    """Shared filesystems jobs need (FSx, /home) are mounted."""

    name = "system.mounts"
    family = "system"
    Options = MountsOptions

    def run(self) -> CheckResult:
        text = read_text(self.ctx.paths.proc("mounts")) or read_text(self.ctx.paths.proc("self", "mounts"))
        if text is None:
            return self.result(Status.UNKNOWN, "cannot read mounts")
        # /proc/mounts escapes spaces in paths as \040.
        mounted = {line.split()[1].replace("\\040", " ") for line in text.splitlines() if len(line.split()) > 1}
        missing = [m for m in self.options.mountpoints if (m.rstrip("/") or "/") not in mounted]
        if missing:
            return self.fail(
                f"not mounted: {', '.join(missing)}",
                Action.REBOOT,
                "system.mounts",
                False,
                missing=missing,
            )
        return self.ok(
            f"{len(self.options.mountpoints)} required mount(s) present"
            if self.options.mountpoints
            else "no mounts required by the profile",
            mounted=len(mounted),
        )


class StressOptions(CheckOptions):
    duration_s: int = Field(default=30, ge=1)
    cpu_workers: int = Field(default=0, ge=0)  # 0: one per online CPU
    vm_workers: int = Field(default=1, ge=0)
    vm_bytes: str = "20%"


@register
class Stress(Check[StressOptions]):
    """stress-ng CPU and memory stressors with result verification (active: it loads the whole node)."""

    name = "system.stress"
    family = "system"
    kind = Kind.ACTIVE
    Options = StressOptions

    @property
    def timeout_s(self) -> float:
        return self.options.timeout_s or self.options.duration_s + 30.0

    def run(self) -> CheckResult:
        o = self.options
        exe = resolve(self.ctx.command("stress_ng"))
        if exe is None:
            return self.absent("stress-ng not installed")
        argv = [
            exe,
            "--cpu",
            str(o.cpu_workers),
            "--cpu-method",
            "all",
            "--verify",
            "--timeout",
            f"{o.duration_s}s",
            "--metrics-brief",
        ]
        if o.vm_workers:
            argv += ["--vm", str(o.vm_workers), "--vm-bytes", o.vm_bytes]
        res = proc.run(argv, self.timeout_s - 2, extra_env={"TMPDIR": os.environ.get("TMPDIR", "/tmp")})
        tail = (res.stderr + res.stdout).strip().splitlines()[-15:]
        if res.timed_out:
            return self.result(Status.UNKNOWN, res.describe(), output=tail)
        if res.returncode == 0:
            return self.ok(f"stress-ng ran {o.duration_s} s with verification", output=tail)
        if res.returncode == 2:  # a stressor failed, which with --verify means a wrong result
            return self.fail(
                f"stress-ng verification failed: {res.describe()}",
                Action.REBOOT,
                "system.stress",
                False,
                output=tail,
            )
        # 1: bad arguments, 3: not enough resources, 4: stressor not implemented: our problem, not the node's.
        return self.result(Status.UNKNOWN, f"stress-ng could not run: {res.describe()}", output=tail)
