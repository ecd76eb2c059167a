"""What the controller must not forget: one JSON file per node under repair, written atomically.

A record is the whole truth about one repair: the step it is at, since when, the rung of the escalation
ladder, the node's slurmd/boot times before the provider acted (how we know it came back), and the last
health-gate result. The loop writes the record *before* it acts on a step, so a controller killed at any
point restarts knowing what it had started. A lock file keeps a second controller out of the same directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, TypeVar

from hpresilience.errors import HPResilienceError
from hpresilience.fileio import atomic_write_text, read_json_state
from hpresilience.log import get_logger
from hpresilience.reasons import Action

log = get_logger("hpresilience.controller")


class Step(StrEnum):
    """Where a repair stands (docs/design.md draws the transitions). The value is the word stored in the
    record's JSON and shown by `hpresilience controller status`."""

    # Detected, waiting for its jobs to end (or to be forced down) or for a free repair slot.
    PENDING = "pending"
    # The provider was asked to act.
    ACTING = "acting"
    # Waiting for slurmd to register again.
    WAITING_BACK = "waiting_back"
    # The health gate runs.
    GATING = "gating"
    # Left out of service for a person.
    GIVEN_UP = "given_up"
    # It passed its gate but was repaired too often (controller.lemon_repairs within lemon_window_s): left
    # drained for a person.
    LEMON = "lemon"


STEPS = tuple(Step)
# Steps in which the node waits for a person: nothing of ours acts on it until someone resumes it.
FOR_A_PERSON = frozenset({Step.GIVEN_UP, Step.LEMON})
ACTIVE_STEPS = frozenset({Step.ACTING, Step.WAITING_BACK, Step.GATING})
# What a record may ask a provider for (the controller's ladder has only these words).
REPAIR_ACTIONS = frozenset({Action.REBOOT, Action.REPLACE})
E = TypeVar("E", bound=StrEnum)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class ControllerLocked(HPResilienceError):
    """Another controller already runs on this state directory."""


@dataclass
class RepairRecord:
    node: str
    requested: Action  # the action asked for: reboot | replace
    reason: str  # the node's reason when the repair was picked up
    provider: str
    detected_at: float
    step: Step = Step.PENDING
    step_since: float = 0.0
    rung: int = 0  # index into the escalation ladder
    attempt: int = 0  # provider actions taken so far
    action: Action | None = None  # the action of the current attempt; None before the first
    forced_down: bool = False
    slurmd_before: int | None = None
    boot_before: int | None = None
    acted_at: float | None = None
    last_health: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    why: str = ""

    def move(self, step: Step, why: str, now: float | None = None) -> None:
        t = time.time() if now is None else now
        self.history.append({"at": round(t, 3), "from": self.step.value, "to": step.value, "why": why})
        del self.history[:-20]  # bounded: a record must stay small whatever happens
        self.step, self.step_since, self.why = step, t, why

    @property
    def current(self) -> Action:
        """The action of the current attempt, or the one asked for before the first attempt."""
        return self.action or self.requested

    def to_json(self) -> dict[str, Any]:
        """The stored form: the words as plain strings, and "" for no attempt yet (the format records have
        always had, so a controller of either side of a change reads the other's)."""
        data = asdict(self)
        data.update(
            requested=self.requested.value, step=self.step.value, action=self.action.value if self.action else ""
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RepairRecord:
        """A stored record; ValueError naming the field whose word is not one of ours."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["step"] = _word(Step, "step", values.get("step", Step.PENDING.value), STEPS)
        values["requested"] = _word(Action, "requested", values.get("requested"), REPAIR_ACTIONS)
        raw = values.get("action") or None
        values["action"] = None if raw is None else _word(Action, "action", raw, REPAIR_ACTIONS)
        return cls(**values)


def _word(kind: type[E], name: str, raw: object, allowed: Iterable[E]) -> E:
    try:
        value = kind(raw) if isinstance(raw, str) else None
    except ValueError:
        value = None
    if value is None or value not in allowed:
        raise ValueError(f"unknown {name} {raw!r}")
    return value


class StateStore:
    """Records under `<dir>/nodes/<node>.json`, finished repairs appended to `<dir>/history.jsonl`."""

    def __init__(self, directory: str | os.PathLike[str], persist: bool = True) -> None:
        self.dir = Path(directory)
        self.persist = persist
        self._lock_file: IO[str] | None = None

    @property
    def nodes_dir(self) -> Path:
        return self.dir / "nodes"

    def path(self, node: str) -> Path:
        if not _SAFE_NAME.match(node):
            raise ValueError(f"node name {node!r} cannot name a state file")
        return self.nodes_dir / f"{node}.json"

    def lock(self) -> None:
        """Take the directory for this process; raises ControllerLocked naming the holder's pid."""
        self.dir.mkdir(parents=True, exist_ok=True)
        f = open(self.dir / "controller.lock", "a+")  # noqa: SIM115 - held open for the process lifetime
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise ControllerLocked(f"another controller (pid {holder}) holds {self.dir / 'controller.lock'}") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock_file = f

    def unlock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def load_all(self, quarantine: bool = True) -> dict[str, RepairRecord]:
        """Every readable record; a corrupt file is logged (and, for the daemon, set aside), never fatal."""
        out: dict[str, RepairRecord] = {}
        if not self.nodes_dir.is_dir():
            return out
        for p in sorted(self.nodes_dir.glob("*.json")):
            try:
                rec = RepairRecord.from_json(json.loads(p.read_text()))
            except (OSError, ValueError, TypeError) as err:
                log.error("repair_record_unreadable", path=str(p), error=str(err))
                if not quarantine:
                    continue
                try:
                    os.replace(p, p.with_suffix(".corrupt"))
                except OSError:
                    pass
                continue
            out[rec.node] = rec
        return out

    def save(self, rec: RepairRecord) -> None:
        if not self.persist:
            return
        # A repair's step must survive a crash of the head node, not only of the controller: fsync first.
        atomic_write_text(self.path(rec.node), json.dumps(rec.to_json(), sort_keys=True), fsync=True)

    def finish(self, rec: RepairRecord, outcome: str) -> None:
        """Drop the node's record and keep one line of it in the history."""
        if not self.persist:
            return
        line = {
            "node": rec.node,
            "outcome": outcome,
            "at": round(time.time(), 3),
            "requested": rec.requested.value,
            "provider": rec.provider,
            "attempts": rec.attempt,
            "detected_at": rec.detected_at,
            "last_health": rec.last_health,
            "why": rec.why,
        }
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "history.jsonl", "a") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
        try:
            self.path(rec.node).unlink()
        except FileNotFoundError:
            pass

    def repairs_since(self, node: str, since: float) -> list[dict[str, Any]]:
        """The node's finished repairs (outcome "repaired") at or after `since`, and after the last time a person
        put it back while it was left for them (outcome "lemon_cleared"): what the lemon rule counts."""
        out: list[dict[str, Any]] = []
        for h in self.history(limit=None):
            if h.get("node") != node or not isinstance(h.get("at"), (int, float)):
                continue
            if h.get("outcome") == "lemon_cleared":
                out = []
            elif h.get("outcome") == "repaired" and h["at"] >= since:
                out.append(h)
        return out

    def history(self, limit: int | None = 20) -> list[dict[str, Any]]:
        try:
            lines = (self.dir / "history.jsonl").read_text().splitlines()
            lines = lines[-limit:] if limit is not None else lines
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    # -- Slurm's own features, as the controller found them at start (for `hpresilience status`) -------
    @property
    def features_path(self) -> Path:
        return self.dir / "slurm_features.json"

    def save_features(self, features: dict[str, Any]) -> None:
        if self.persist:
            atomic_write_text(self.features_path, json.dumps(features, sort_keys=True))

    def features(self) -> dict[str, Any] | None:
        """What the controller last found; None when it never wrote it (or it cannot be read)."""
        return read_json_state(self.features_path, "slurm_features_unreadable")
