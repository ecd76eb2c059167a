"""Helpers shared by the check families: device discovery, escalation, reporting the worst finding."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpresilience.fileio import atomic_write_text, read_json_state
from hpresilience.health.base import CheckContext, CheckResult, HostPaths, read_text
from hpresilience.health.escalation import EscalationStore
from hpresilience.health.verdict import worst
from hpresilience.log import get_logger
from hpresilience.reasons import Action

log = get_logger("hpresilience.health")


def report(findings: Sequence[CheckResult], evidence: dict[str, Any]) -> CheckResult:
    """A run that found something reports its worst finding (Check.finding): a failure when that asks for
    an action, else a warning; `evidence` replaces the finding's own (it usually lists them all)."""
    w = worst(findings)
    # Check.finding already chose fail or warn; only a failure may be acted on without a repeat.
    return replace(w, certain=w.certain and w.asks_action, evidence=evidence)


def finding_dict(r: CheckResult) -> dict[str, Any]:
    """A finding as the evidence lists it: what, action, key, then its own details."""
    return {"what": r.reason, "action": r.action.value, "key": r.key, **r.evidence}


def ladder(ctx: CheckContext, key: str) -> tuple[Action, int]:
    """Reboot-then-replace for `key`, counted in distinct boots on disk."""
    store = EscalationStore(ctx.state_path("escalation.json"), ctx.reboots_before_replace, ctx.escalation_window_s)
    return store.escalate(key, ctx.boot_id())


def resolve_action(ctx: CheckContext, name: str, key: str) -> tuple[Action, int]:
    """Turn a catalogue action name into a suggested action (running the ladder where asked)."""
    if name == "reboot_then_replace":
        return ladder(ctx, key)
    return {"reboot": Action.REBOOT, "replace": Action.REPLACE}.get(name, Action.NONE), 0


def nvidia_pci_devices(paths: HostPaths) -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers (NVSwitches, class 0x0680, are not GPUs)."""
    out = []
    for dev in paths.glob(paths.sys("bus", "pci", "devices"), "*"):
        if read_text(dev / "vendor") == "0x10de" and (read_text(dev / "class") or "").startswith(("0x0302", "0x0300")):
            out.append(dev.name)
    return out


def nvswitch_pci_devices(paths: HostPaths) -> list[str]:
    """PCI addresses of NVIDIA NVSwitches (vendor 0x10de, class 0x0680: bridge, other)."""
    return [
        dev.name
        for dev in paths.glob(paths.sys("bus", "pci", "devices"), "*")
        if read_text(dev / "vendor") == "0x10de" and (read_text(dev / "class") or "").startswith("0x0680")
    ]


def neuron_devices(paths: HostPaths) -> list[Path]:
    found = paths.glob(paths.sys("devices", "virtual", "neuron_device"), "neuron[0-9]*")
    return sorted(found, key=lambda p: int("".join(ch for ch in p.name if ch.isdigit()) or 0))


def load_json(path: Path) -> dict[str, Any]:
    """A check's state file (driver version, counter baselines): fileio's tolerant read."""
    return read_json_state(path, "health_state_unreadable") or {}


def save_json(path: Path, data: dict[str, Any]) -> None:
    try:
        atomic_write_text(path, json.dumps(data, sort_keys=True))
    except OSError as err:
        log.warning("health_state_not_saved", path=str(path), error=str(err))
