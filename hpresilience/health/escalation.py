"""Reboot-then-replace: remembering, across reboots, in which boots a fault was seen.

A fault key (`nvidia:79:0000:53:00`, `gpu.remap_pending:0000:53:00`) seen in boot A asks for a reboot.
Seen again in boot B (it came back after one reboot), again a reboot; seen in a third boot with the
default of 2 reboots, a replacement. The file is small JSON, written atomically; a corrupt or
unreadable file is logged and treated as empty, which can only delay a replacement, never cause one.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from hpresilience.fileio import atomic_write_text, read_json_state
from hpresilience.log import get_logger
from hpresilience.reasons import Action

log = get_logger("hpresilience.health")
_lock = threading.Lock()


class EscalationStore:
    def __init__(self, path: Path, reboots_before_replace: int = 2, window_s: float = 14 * 86400.0) -> None:
        self.path = path
        self.reboots_before_replace = reboots_before_replace
        self.window_s = window_s

    def _load(self) -> dict[str, dict[str, float]]:
        data = read_json_state(self.path, "escalation_state_unreadable") or {}
        faults = data.get("faults", {})
        return {
            str(key): {str(b): float(t) for b, t in boots.items() if isinstance(t, (int, float))}
            for key, boots in (faults.items() if isinstance(faults, dict) else ())
            if isinstance(boots, dict)
        }

    def _save(self, faults: dict[str, dict[str, float]]) -> None:
        try:
            atomic_write_text(self.path, json.dumps({"version": 1, "faults": faults}, sort_keys=True))
        except OSError as err:
            log.warning("escalation_state_not_saved", path=str(self.path), error=str(err))

    def record(self, key: str, boot_id: str, now: float | None = None) -> int:
        """Note that `key` was seen in this boot; returns in how many distinct boots (within the window)."""
        t = time.time() if now is None else now
        with _lock:
            faults = self._load()
            boots = {b: ts for b, ts in faults.get(key, {}).items() if t - ts <= self.window_s}
            boots.setdefault(boot_id, t)
            faults[key] = boots
            faults = {k: v for k, v in faults.items() if v}
            self._save(faults)
        return len(boots)

    def boots_seen(self, key: str) -> int:
        return len(self._load().get(key, {}))

    def escalate(self, key: str, boot_id: str, now: float | None = None) -> tuple[Action, int]:
        """Record a reboot-then-replace fault; reboot until it has come back after N reboots, then replace."""
        boots = self.record(key, boot_id, now)
        reboots_since_first = boots - 1
        if reboots_since_first >= self.reboots_before_replace:
            return Action.REPLACE, boots
        return Action.REBOOT, boots
