"""DCGM: the health watches (passive) and `dcgmi diag -r N` (active), where DCGM is installed."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from hpresilience import proc
from hpresilience.health.base import Check, CheckOptions, CheckResult, Kind, Status, register
from hpresilience.health.checks.common import ladder
from hpresilience.proc import resolve
from hpresilience.reasons import Action

# Diag durations per level (DCGM docs): r1 seconds, r2 ~2 min, r3 ~15-30 min, r4 up to hours.
LEVEL_TIMEOUT_S = {1: 120.0, 2: 600.0, 3: 2700.0, 4: 9000.0}


def _walk(node: Any) -> Any:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def parse_health(text: str) -> tuple[str, list[str]]:
    """Overall health ("Healthy", "Warning", "Failure") and the incident messages of `dcgmi health -c -j`."""
    data = json.loads(text)
    overall = "Healthy"
    messages: list[str] = []
    rank = {"healthy": 0, "pass": 0, "warning": 1, "warn": 1, "failure": 2, "fail": 2}
    for d in _walk(data):
        for k, v in d.items():
            val = v.get("value") if isinstance(v, dict) else v
            worse = isinstance(val, str) and rank.get(val.lower(), 0) > rank.get(overall.lower(), 0)
            if worse and isinstance(val, str) and k.lower() in ("overall health", "health"):
                overall = val
            if isinstance(val, str) and k.lower() in ("error", "message", "incident") and val:
                messages.append(val)
    return overall, messages


def parse_diag(text: str) -> list[dict[str, Any]]:
    """Per-test results of `dcgmi diag -j` (DCGM 3 and 4 layouts): name, status, gpu, warning level, info."""
    data = json.loads(text)
    out = []
    for d in _walk(data):
        name = d.get("name") or d.get("test_name")
        results = d.get("results")
        if not isinstance(name, str) or not isinstance(results, list):
            continue
        for r in results:
            if not isinstance(r, dict):
                continue
            status = str(r.get("status", "")).lower()
            warn = r.get("warnings") or r.get("warning") or r.get("info") or ""
            text_ = "; ".join(
                w.get("warning", str(w)) if isinstance(w, dict) else str(w)
                for w in (warn if isinstance(warn, list) else [warn])
                if w
            )
            level = r.get("warning_level")
            if level is None and isinstance(r.get("error_severity"), int):
                level = r["error_severity"]
            out.append(
                {
                    "test": name,
                    "status": status,
                    "gpu": r.get("gpu_id", r.get("entity_id")),
                    "warning_level": level,
                    "detail": text_[:300],
                }
            )
    return out


@register
class DcgmHealth(Check[CheckOptions]):
    """DCGM's background health watches (PCIe, NVLink, memory, SM, thermal, power, ...)."""

    name = "dcgm.health"
    family = "dcgm"
    default_timeout_s = 15.0

    def run(self) -> CheckResult:
        exe = resolve(self.ctx.command("dcgmi"))
        if exe is None:
            return self.absent("dcgmi not installed")
        res = proc.run([exe, "health", "-c", "-j"], self.timeout_s - 1)
        if not res.ok:
            return self.result(Status.UNKNOWN, f"DCGM health not readable: {res.describe()}")
        try:
            overall, messages = parse_health(res.stdout)
        except ValueError as err:
            return self.result(Status.UNKNOWN, f"dcgmi health printed output that is not JSON: {err}")
        if overall.lower() in ("failure", "fail"):
            return self.fail(
                f"DCGM health: {overall}: {'; '.join(messages)[:200]}",
                Action.REBOOT,
                "dcgm.health",
                False,
                messages=messages,
            )
        if overall.lower() in ("warning", "warn"):
            return self.warn(
                f"DCGM health: {overall}: {'; '.join(messages)[:200]}", key="dcgm.health", messages=messages
            )
        return self.ok("DCGM health watches report healthy", messages=messages)


class DcgmDiagOptions(CheckOptions):
    level: int = Field(default=1, ge=1, le=4)


@register
class DcgmDiag(Check[DcgmDiagOptions]):
    """`dcgmi diag -r N`: level 1 in seconds (prolog-safe on an idle node), 3/4 only on drained nodes."""

    name = "dcgm.diag"
    family = "dcgm"
    kind = Kind.ACTIVE
    default_timeout_s = 120.0
    Options = DcgmDiagOptions

    @property
    def timeout_s(self) -> float:
        return self.options.timeout_s or LEVEL_TIMEOUT_S[self.options.level]

    def run(self) -> CheckResult:
        exe = resolve(self.ctx.command("dcgmi"))
        if exe is None:
            return self.absent("dcgmi not installed")
        res = proc.run([exe, "diag", "-r", str(self.options.level), "-j"], self.timeout_s - 1)
        try:
            tests = parse_diag(res.stdout)
        except ValueError:
            return self.result(Status.UNKNOWN, f"dcgmi diag did not print JSON: {res.describe()}")
        failed = [t for t in tests if t["status"] == "fail"]
        warned = [t for t in tests if t["status"] == "warn"]
        ev = {"level": self.options.level, "tests": tests}
        if failed:
            first = failed[0]
            key = f"dcgm.diag:{first['test']}"
            if any(t.get("warning_level") == 3 for t in failed):
                return self.fail(
                    f"DCGM diag r{self.options.level} {first['test']} failed (isolate): {first['detail']}",
                    Action.REPLACE,
                    key,
                    True,
                    evidence=ev,
                )
            action, boots = ladder(self.ctx, key)
            return self.fail(
                f"DCGM diag r{self.options.level} {first['test']} failed: {first['detail']}",
                action,
                key,
                True,
                boots_seen=boots,
                evidence=ev,
            )
        if warned:
            return self.warn(f"DCGM diag r{self.options.level} {warned[0]['test']}: {warned[0]['detail']}", evidence=ev)
        if not tests:
            return self.result(Status.UNKNOWN, f"dcgmi diag reported no tests: {res.describe()}", evidence=ev)
        passed = [t for t in tests if t["status"] == "pass"]
        if not passed:
            # Every test Skip (wrong GPU model, MIG on, a plugin missing): nothing was tested, which is
            # not a pass.
            states = sorted({t["status"] or "(none)" for t in tests})
            return self.result(
                Status.UNKNOWN,
                f"DCGM diag r{self.options.level}: none of {len(tests)} result(s) passed "
                f"({', '.join(states)}): nothing was tested",
                evidence=ev,
            )
        skipped = len(tests) - len(passed)
        note = f", {skipped} skipped" if skipped else ""
        return self.ok(f"DCGM diag r{self.options.level}: {len(passed)} result(s) passed{note}", evidence=ev)
