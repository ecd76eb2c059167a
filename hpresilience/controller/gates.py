"""Health gates: what a repaired node must pass before the controller resumes it.

The controller cannot srun onto a drained node, so the gate is something the controller runs itself:
`command` runs a template (`ssh -- {address} hpresilience check --active` by default; exit 0 = pass) and
`none` always passes. Gates register by name; an unknown name is a ConfigError listing the known ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hpresilience.controller.settings import GateSettings
from hpresilience.controller.templates import GATE_KEYS, render, run_site_command, template_problem
from hpresilience.errors import ConfigError, HPResilienceError
from hpresilience.registry import Registry
from hpresilience.slurm.models import Node


@dataclass(frozen=True)
class GateResult:
    passed: bool
    detail: str
    duration_s: float
    at: float

    def to_json(self) -> dict[str, object]:
        return {"passed": self.passed, "detail": self.detail, "duration_s": round(self.duration_s, 3),
                "at": round(self.at, 3)}


class Gate(Protocol):
    name: str

    def check(self, node: Node) -> GateResult: ...


class NoGate:
    name = "none"

    def __init__(self, settings: GateSettings) -> None:
        self.settings = settings

    def check(self, node: Node) -> GateResult:
        return GateResult(True, "no health gate configured", 0.0, time.time())


class CommandGate:
    name = "command"

    def __init__(self, settings: GateSettings) -> None:
        problem = template_problem(settings.command, GATE_KEYS)
        if problem:  # settings built without validation (model_construct) still get the load-time check
            raise ConfigError(f"controller.gate.command: {problem}")
        self.settings = settings

    def check(self, node: Node) -> GateResult:
        started = time.monotonic()
        try:
            argv = render(self.settings.command, {"node": node.name, "address": node.address or node.name,
                                                  "hostname": node.hostname or node.name})
            rc, out = run_site_command(argv, self.settings.timeout_s)
        except HPResilienceError as err:
            return GateResult(False, str(err), time.monotonic() - started, time.time())
        tail = " | ".join(out.strip().splitlines()[-3:])[-300:]
        detail = f"exit {rc}" + (f": {tail}" if tail else "")
        return GateResult(rc == 0, detail, time.monotonic() - started, time.time())


GATES: Registry[Callable[[GateSettings], Gate]] = Registry("gate", {"command": CommandGate, "none": NoGate})


def create_gate(settings: GateSettings) -> Gate:
    try:
        factory = GATES.get(settings.kind)
    except ConfigError as err:
        raise ConfigError(f"controller.gate.kind: {err}") from None
    return factory(settings)
