"""Health gates: what a repaired node must pass before the controller resumes it.

`slurm` (the default) needs no ssh: it reserves the node (a MAINT reservation, so no other job can land
there), lets it out of the repair's DRAIN, runs `hpresilience check --active --strict` on it as a Slurm job
inside the reservation, puts the DRAIN back and removes the reservation; the job's output is kept as
evidence under the controller's state directory. `command` runs a template the controller runs itself (an
ssh command line; exit 0 = pass) and `none` always passes. Gates register by name; an unknown name is a
ConfigError listing the known ones.
"""

from __future__ import annotations

import getpass
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import Field, ValidationInfo, field_validator

from hpresilience.controller.templates import (
    GATE_KEYS,
    job_command_problem,
    render,
    run_site_command,
    template_problem,
)
from hpresilience.errors import ConfigError, HPResilienceError
from hpresilience.fileio import atomic_write_text
from hpresilience.log import get_logger
from hpresilience.reasons import parse_reason
from hpresilience.registry import Registry
from hpresilience.settings_base import Section, reference_error
from hpresilience.slurm import reservations
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node

log = get_logger("hpresilience.controller")
# Gate outputs kept per node: enough to compare the last few repairs, bounded whatever happens.
EVIDENCE_KEPT = 10
# Directories every user may write on a node: never the gate job's working directory.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")


# The gates' own settings section (controller.gate), beside the gates it chooses among: settings.py composes it.
class GateSettings(Section):
    """The health gate a repaired node must pass before it is resumed."""

    # `slurm`: run `job_command` on the node as a Slurm job in a maintenance reservation (no ssh needed).
    # `command`: the controller runs `command` itself (a template: {node}, {address}, {hostname}; an ssh command
    # line by default); exit 0 = pass. `none`: always pass.
    kind: str = "slurm"
    # `--strict`: no post-boot grace, so a node that came back short of GPUs fails now (docs/controller.md).
    job_command: list[str] = Field(
        default_factory=lambda: ["/opt/hpresilience/venv/bin/hpresilience", "check", "--active", "--strict"]
    )
    # The gate job's working directory on the node. The job runs as the controller's user (root): never a
    # directory users write, where a file they left would be run or imported in its stead (issue 31).
    job_chdir: str = "/"
    command: list[str] = Field(
        default_factory=lambda: [
            # "--": whatever Slurm holds as NodeAddr, ssh takes it as the host, never as an option.
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=15",
            "--",
            "{address}",
            "/opt/hpresilience/venv/bin/hpresilience",
            "check",
            "--active",
            "--strict",
        ]
    )
    timeout_s: float = Field(default=900.0, gt=0)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in GATES:
            raise reference_error(f"unknown gate {kind!r}; known: {', '.join(GATES.names())}")
        return kind

    @field_validator("command")
    @classmethod
    def _command_template(cls, command: list[str], info: ValidationInfo) -> list[str]:
        problem = template_problem(command, GATE_KEYS) if info.data.get("kind") == "command" else None
        if problem:
            raise reference_error(problem)
        return command

    @field_validator("job_chdir")
    @classmethod
    def _private_chdir(cls, path: str) -> str:
        if not path.startswith("/"):
            raise reference_error(f"{path!r} is not an absolute path")
        if any(path == d or path.startswith(d + "/") for d in SHARED_WRITABLE):
            raise reference_error(
                f"{path} is writable by every user, and the gate job runs as root there: use / (the default) "
                "or a directory only root writes"
            )
        return path

    @field_validator("job_command")
    @classmethod
    def _job_command_template(cls, command: list[str]) -> list[str]:
        problem = job_command_problem(command)
        if problem:
            raise reference_error(problem)
        return command


@dataclass(frozen=True)
class GateResult:
    passed: bool
    detail: str
    duration_s: float
    at: float

    def to_json(self) -> dict[str, object]:
        return {
            "passed": self.passed,
            "detail": self.detail,
            "duration_s": round(self.duration_s, 3),
            "at": round(self.at, 3),
        }


class Gate(Protocol):
    name: str

    def check(self, node: Node) -> GateResult: ...


@dataclass(frozen=True)
class GateContext:
    """What a gate may use besides its settings: the controller's Slurm client, where evidence is kept."""

    client: SlurmClient | None = None
    evidence_dir: Path | None = None


class NoGate:
    name = "none"

    def __init__(self, settings: GateSettings, context: GateContext | None = None) -> None:
        self.settings = settings

    def check(self, node: Node) -> GateResult:
        return GateResult(True, "no health gate configured", 0.0, time.time())


class CommandGate:
    name = "command"

    def __init__(self, settings: GateSettings, context: GateContext | None = None) -> None:
        problem = template_problem(settings.command, GATE_KEYS)
        if problem:  # settings built without validation (model_construct) still get the load-time check
            raise ConfigError(f"controller.gate.command: {problem}")
        self.settings = settings

    def check(self, node: Node) -> GateResult:
        started = time.monotonic()
        try:
            argv = render(
                self.settings.command,
                {"node": node.name, "address": node.address or node.name, "hostname": node.hostname or node.name},
            )
            rc, out = run_site_command(argv, self.settings.timeout_s)
        except HPResilienceError as err:
            return GateResult(False, str(err), time.monotonic() - started, time.time())
        tail = " | ".join(out.strip().splitlines()[-3:])[-300:]
        detail = f"exit {rc}" + (f": {tail}" if tail else "")
        return GateResult(rc == 0, detail, time.monotonic() - started, time.time())


class SlurmGate:
    name = "slurm"

    def __init__(self, settings: GateSettings, context: GateContext | None = None) -> None:
        if context is None or context.client is None:
            raise ConfigError("controller.gate.kind slurm needs the controller's Slurm client")
        problem = job_command_problem(settings.job_command)
        if problem:
            raise ConfigError(f"controller.gate.job_command: {problem}")
        self.settings = settings
        self.client = context.client
        self.evidence_dir = context.evidence_dir
        self.user = _user()

    def reservation(self, node: Node) -> str:
        return f"hpr-gate-{node.name}"

    def job_argv(self, node: Node) -> list[str]:
        argv = self.settings.job_command
        if any("{" in part for part in argv):
            return render(
                argv, {"node": node.name, "address": node.address or node.name, "hostname": node.hostname or node.name}
            )
        return list(argv)

    def check(self, node: Node) -> GateResult:
        started = time.monotonic()
        resv = self.reservation(node)
        # The reservation outlives the job by a margin, and ends by itself if the controller dies mid-gate.
        try:
            argv = self.job_argv(node)
            reservations.create_maintenance_reservation(
                self.client, resv, [node.name], [self.user], self.settings.timeout_s + 300
            )
        except HPResilienceError as err:
            return GateResult(
                False, f"could not reserve {node.name} for the gate job: {err}", time.monotonic() - started, time.time()
            )
        rc: int | None = None
        out = said = ""  # said: what the job printed (srun's own lines only when it printed nothing)
        try:
            # The repair's DRAIN would keep the gate's own job off the node; the reservation keeps every other
            # job off it meanwhile.
            self.client.set_node_state([node.name], "resume")
            res = reservations.run_in_reservation(
                self.client,
                resv,
                node.name,
                argv,
                self.settings.timeout_s,
                resv,
                node.partitions,
                self.settings.job_chdir,
            )
            rc, out, said = res.returncode, res.stdout + res.stderr, res.stdout.strip() or res.stderr.strip()
            detail = f"gate job exit {rc}"
        except HPResilienceError as err:
            detail = f"gate job did not run to its end: {err}"
            out = said = str(err)
        finally:
            self._restore(node)
            try:
                reservations.delete_reservation(self.client, resv)
            except HPResilienceError as err:  # it ends by itself at its end time
                log.warning("gate_reservation_not_deleted", node=node.name, reservation=resv, error=str(err)[:300])
        evidence = self._keep(node, argv, rc, out)
        tail = " | ".join(said.splitlines()[-3:])[-300:]
        detail += (f": {tail}" if tail else "") + (f" (output: {evidence})" if evidence else "")
        return GateResult(rc == 0, detail, time.monotonic() - started, time.time())

    def _restore(self, node: Node) -> None:
        """The repair's DRAIN back (its reason as it was), unless someone else set a reason meanwhile: the
        controller resumes the node only after the gate passed, from its own cycle."""
        try:
            now = self.client.node(node.name)
        except HPResilienceError as err:
            log.error("gate_node_unreadable", node=node.name, error=str(err)[:300])
            now = None
        if now is not None and now.reason and parse_reason(now.reason).owner != "controller":
            log.warning("gate_reason_changed", node=node.name, reason=now.reason)
            return
        try:
            self.client.set_node_state([node.name], "drain", node.reason or "[hpr-controller] health gate")
        except HPResilienceError as err:
            log.error("gate_drain_not_restored", node=node.name, error=str(err)[:300])

    def _keep(self, node: Node, argv: list[str], rc: int | None, out: str) -> str:
        if self.evidence_dir is None:
            return ""
        path = self.evidence_dir / f"{node.name}-{time.time():.0f}.json"
        try:
            atomic_write_text(
                path,
                json.dumps(
                    {"node": node.name, "argv": argv, "exit_code": rc, "at": time.time(), "output": out[-65536:]},
                    indent=1,
                ),
            )
            for old in sorted(self.evidence_dir.glob(f"{node.name}-*.json"))[:-EVIDENCE_KEPT]:
                old.unlink(missing_ok=True)
        except OSError as err:
            log.warning("gate_evidence_not_saved", node=node.name, path=str(path), error=str(err))
            return ""
        return str(path)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "root"


GATES: Registry[Callable[[GateSettings, GateContext | None], Gate]] = Registry(
    "gate", {"slurm": SlurmGate, "command": CommandGate, "none": NoGate}
)


def create_gate(settings: GateSettings, context: GateContext | None = None) -> Gate:
    try:
        factory = GATES.get(settings.kind)
    except ConfigError as err:
        raise ConfigError(f"controller.gate.kind: {err}") from None
    return factory(settings, context)
