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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from hpresilience.errors import HPResilienceError
from hpresilience.fileio import atomic_write_text
from hpresilience.log import get_logger

log = get_logger("hpresilience.controller")

# pending: detected, waiting for its jobs to end (or to be forced down) or for a free repair slot.
# acting: the provider was asked to act. waiting_back: waiting for slurmd to register again.
# gating: the health gate runs. given_up: left out of service for a person. lemon: it passed its gate but
# was repaired too often (controller.lemon_repairs within lemon_window_s): left drained for a person.
STEPS = ("pending", "acting", "waiting_back", "gating", "given_up", "lemon")
# Steps in which the node waits for a person: nothing of ours acts on it until someone resumes it.
FOR_A_PERSON = frozenset({"given_up", "lemon"})
ACTIVE_STEPS = frozenset({"acting", "waiting_back", "gating"})
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class ControllerLocked(HPResilienceError):
    """Another controller already runs on this state directory."""


@dataclass
class RepairRecord:
    node: str
    requested: str  # the action asked for: reboot | replace
    reason: str  # the node's reason when the repair was picked up
    provider: str
    detected_at: float
    step: str = "pending"
    step_since: float = 0.0
    rung: int = 0  # index into the escalation ladder
    attempt: int = 0  # provider actions taken so far
    action: str = ""  # the action of the current attempt
    forced_down: bool = False
    slurmd_before: int | None = None
    boot_before: int | None = None
    acted_at: float | None = None
    last_health: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    why: str = ""

    def move(self, step: str, why: str, now: float | None = None) -> None:
        t = time.time() if now is None else now
        self.history.append({"at": round(t, 3), "from": self.step, "to": step, "why": why})
        del self.history[:-20]  # bounded: a record must stay small whatever happens
        self.step, self.step_since, self.why = step, t, why

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RepairRecord:
        known = {f.name for f in fields(cls)}
        rec = cls(**{k: v for k, v in data.items() if k in known})
        if rec.step not in STEPS:
            raise ValueError(f"unknown step {rec.step!r}")
        return rec


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
        line = {"node": rec.node, "outcome": outcome, "at": round(time.time(), 3), "requested": rec.requested,
                "provider": rec.provider, "attempts": rec.attempt, "detected_at": rec.detected_at,
                "last_health": rec.last_health, "why": rec.why}
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
