"""Helpers shared by the check families: device discovery, escalation, findings."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpresilience.fileio import atomic_write_text
from hpresilience.health.base import ACTION_RANK, CheckContext, HostPaths, SuggestedAction, read_text
from hpresilience.health.escalation import EscalationStore
from hpresilience.log import get_logger

log = get_logger("hpresilience.health")


@dataclass(frozen=True)
class Finding:
    """One thing wrong inside a check's run; the check reports the worst and lists all as evidence."""

    what: str
    action: SuggestedAction
    key: str
    certain: bool
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "action": self.action.value, "key": self.key, **self.detail}


def worst(findings: list[Finding]) -> Finding:
    return max(findings, key=lambda f: (ACTION_RANK[f.action], f.certain))


def ladder(ctx: CheckContext, key: str) -> tuple[SuggestedAction, int]:
    """Reboot-then-replace for `key`, counted in distinct boots on disk."""
    store = EscalationStore(
        ctx.state_path("escalation.json"), ctx.reboots_before_replace, ctx.escalation_window_s
    )
    return store.escalate(key, ctx.boot_id())


def resolve_action(ctx: CheckContext, name: str, key: str) -> tuple[SuggestedAction, int]:
    """Turn a catalogue action name into a suggested action (running the ladder where asked)."""
    if name == "reboot_then_replace":
        return ladder(ctx, key)
    return {"reboot": SuggestedAction.REBOOT, "replace": SuggestedAction.REPLACE}.get(
        name, SuggestedAction.NONE
    ), 0


def nvidia_pci_devices(paths: HostPaths) -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers (NVSwitches, class 0x0680, are not GPUs)."""
    out = []
    for dev in paths.glob(paths.sys("bus", "pci", "devices"), "*"):
        if read_text(dev / "vendor") == "0x10de" and (read_text(dev / "class") or "").startswith(
            ("0x0302", "0x0300")
        ):
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
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("health_state_unreadable", path=str(path), error=str(err))
        return {}


def save_json(path: Path, data: dict[str, Any]) -> None:
    try:
        atomic_write_text(path, json.dumps(data, sort_keys=True))
    except OSError as err:
        log.warning("health_state_not_saved", path=str(path), error=str(err))
