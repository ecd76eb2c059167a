"""The head node's record of every decision: `<controller.state_dir>/events.jsonl`, one JSON line per event.

Agents write their decisions only into Slurm (a node's state and reason) and their own node's journal; the
controller reads the nodes out of service every cycle, so it is the one place that sees every agent's mark
and can keep it beside its own steps. What is recorded (`kind`):
- `mark`: a node out of service with an hpresilience reason or an `Action:` request it had not seen before,
  by `agent`, `operator (<user>)` or `controller`, with the reason;
- `back_in_service`: a node it had seen marked is in service again and the controller did not resume it
  (the agent lifted its own mark, or a person resumed it); `reason_replaced`: still out, but a person's
  reason replaced ours;
- the controller's own steps, under the event names of its log lines: `repair_detected`,
  `repair_waiting_for_jobs`, `repair_waiting_for_slot` (a hold), `repair_action_started`, `node_came_back`,
  `health_gate_passed` / `health_gate_failed` (with the gate's output), `repair_escalated`,
  `repair_given_up`, `node_left_for_a_person`, `node_resumed`, `repair_finished`.
The file is appended to (O_APPEND, one write per line) and rotated to `events.jsonl.1` past `max_bytes`, so
it stays bounded whatever the cluster does; `hpresilience events` reads both.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hpresilience.controller.selection import OUT_OF_SERVICE, Look
from hpresilience.log import get_logger

log = get_logger("hpresilience.controller")
MAX_BYTES = 16 * 1024 * 1024
# node -> (the hpresilience or Action: reason last seen on it, Slurm's time of that reason)
Seen = dict[str, tuple[str, int | None]]


class EventLog:
    def __init__(self, directory: str | os.PathLike[str], persist: bool = True, max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(directory) / "events.jsonl"
        self.persist = persist
        self.max_bytes = max_bytes

    def record(self, kind: str, node: str, by: str, why: str = "", at: float | None = None, **extra: Any) -> None:
        """Append one event; a failed write is logged, never raised (the repair goes on)."""
        if not self.persist:
            return
        event = {
            "at": round(time.time() if at is None else at, 3),
            "node": node,
            "kind": kind,
            "by": by,
            "why": why,
            **{k: v for k, v in extra.items() if v is not None},
        }
        line = (json.dumps(event, sort_keys=True, default=str) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._rotate_if_full()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as err:
            log.warning("event_not_recorded", path=str(self.path), kind=kind, node=node, error=str(err))

    def _rotate_if_full(self) -> None:
        try:
            if self.path.stat().st_size >= self.max_bytes:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        except FileNotFoundError:
            pass

    def read(self, node: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        """Events, oldest first, of one node and/or from a time on; unreadable lines are skipped."""
        return [
            e
            for e in self._all()
            if (node is None or e.get("node") == node) and (since is None or float(e.get("at", 0)) >= since)
        ]

    def _all(self) -> Iterator[dict[str, Any]]:
        for p in (self.path.with_name(self.path.name + ".1"), self.path):
            try:
                text = p.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if isinstance(e, dict) and isinstance(e.get("at"), (int, float)):
                    yield e

    def last_marks(self) -> Seen:
        """Per node, the mark seen last and not followed by its return to service: what the controller knew
        before a restart, so it neither records those marks again nor misses their end."""
        seen: Seen = {}
        for e in self._all():
            node = str(e.get("node", ""))
            if e.get("kind") == "mark":
                at = e.get("reason_at")
                seen[node] = (str(e.get("reason", "")), at if isinstance(at, int) else None)
            elif e.get("kind") in ("back_in_service", "node_resumed"):
                seen.pop(node, None)
        return seen

    def note_reasons(self, seen: Seen, looks: Sequence[Look]) -> Seen:
        """Record each hpresilience reason or Action: request the first time it is seen in a snapshot of the nodes
        out of service (an agent's mark, an operator's request), and a marked node's return to service that
        the controller did not make. Returns what is seen now (the `seen` of the next call)."""
        current: Seen = {}
        by_name = {x.node.name: x.node for x in looks}
        for n, parsed in ((x.node, x.reason) for x in looks):
            if not n.states & OUT_OF_SERVICE or (parsed.owner is None and parsed.action is None):
                continue
            current[n.name] = (n.reason, n.reason_changed_at)
            if seen.get(n.name) == current[n.name] or parsed.owner == "controller":
                continue  # the controller's own reasons are recorded as its decisions
            by = "agent" if parsed.owner == "agent" else f"operator ({n.reason_set_by or 'unknown user'})"
            self.record(
                "mark", n.name, by, n.reason, reason=n.reason, reason_at=n.reason_changed_at, state=n.state_text
            )
        for name in [m for m in seen if m not in current]:
            node = by_name.get(name)
            if node is None or not node.states & OUT_OF_SERVICE:
                self.record(
                    "back_in_service", name, "agent or operator", "in service again; the controller did not resume it"
                )
            else:
                self.record(
                    "reason_replaced",
                    name,
                    f"operator ({node.reason_set_by or 'unknown user'})",
                    node.reason,
                    reason=node.reason,
                )
        return current
