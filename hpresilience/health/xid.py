"""The XID catalogue, and reading faults out of kernel-log lines.

Lines come in three shapes, all handled by `parse_line`:
  /dev/kmsg:  `4,1234,5678901,-;NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has...`
  dmesg:      `[ 5678.901234] NVRM: Xid (PCI:0000:53:00): 79, pid=...`  (also `dmesg -T`/journal prefixes)
  Neuron:     `NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-... nd-id=0 ... action=TERMINATE_INSTANCE`
A hostile or garbled line never raises: it is simply not a fault line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpresilience.errors import ConfigError
from hpresilience.fileio import read_yaml

CATALOG_PATH = Path(__file__).parent / "data" / "xid-catalog.yaml"
ACTIONS = ("none", "warn", "reboot", "replace", "reboot_then_replace")
MAX_LINE = 4096

_KMSG = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
_DMESG_TS = re.compile(r"^\[\s*(?P<sec>\d+\.\d+)\]\s*(?P<msg>.*)$")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d{1,4})\b,?\s*(?P<rest>.*)$")
_OFF_BUS = re.compile(
    r"NVRM: GPU (?:at PCI:)?(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}[.0-9]*):? "
    r"GPU has fallen off the bus"
)
_NEURON = re.compile(r"NEURON_HW_ERR=(?P<code>[A-Z0-9_]+)(?P<rest>.*)$")
_KV = re.compile(r"(?P<k>[a-z][a-z_-]*)=(?P<v>\S+)")


@dataclass(frozen=True)
class XidEntry:
    code: str  # "79" or "SRAM_UNCORRECTABLE_ERROR"
    name: str
    action: str


@dataclass(frozen=True)
class FaultEvent:
    """One fault line (or NVML event): vendor "nvidia" or "neuron", a code, and the device it names."""

    vendor: str
    code: str
    device: str  # PCI bus id for NVIDIA ("0000:53:00"), "nd<N>" for Neuron, "" when the line names none
    message: str
    timestamp: float | None = None  # seconds since boot (kmsg/dmesg) or epoch (NVML), when known
    source: str = "kmsg"

    @property
    def key(self) -> str:
        return f"{self.vendor}:{self.code}:{self.device}"


@dataclass(frozen=True)
class Classified:
    event: FaultEvent
    entry: XidEntry
    action: str  # after overrides


class XidCatalog:
    def __init__(self, data: dict[str, Any], source: str, overrides: dict[int, str] | None = None) -> None:
        self.source = source
        try:
            self.version = str(data["version"])
            self.default_action = str(data.get("default_action", "warn"))
            self.nvidia = {
                str(k): XidEntry(str(k), str(v["name"]), str(v["action"]))
                for k, v in (data.get("nvidia") or {}).items()
            }
            self.neuron = {
                str(k): XidEntry(str(k), str(v["name"]), str(v["action"]))
                for k, v in (data.get("neuron") or {}).items()
            }
            self.aliases = {str(k): str(v) for k, v in (data.get("aliases") or {}).items()}
        except (KeyError, TypeError, AttributeError) as err:
            raise ConfigError(f"{source}: malformed XID catalogue: {err}") from None
        for e in [*self.nvidia.values(), *self.neuron.values()]:
            if e.action not in ACTIONS:
                raise ConfigError(
                    f"{source}: XID {e.code}: action {e.action!r} is not one of {', '.join(ACTIONS)}"
                )
        self.overrides = {str(k): v for k, v in (overrides or {}).items()}
        for k, v in self.overrides.items():
            if v not in ACTIONS:
                raise ConfigError(f"health.xid_overrides.{k}: {v!r} is not one of {', '.join(ACTIONS)}")

    def entry(self, vendor: str, code: str) -> XidEntry:
        table = self.nvidia if vendor == "nvidia" else self.neuron
        found = table.get(code)
        if found is not None:
            return found
        return XidEntry(
            code, "unlisted XID" if vendor == "nvidia" else "unlisted Neuron error", self.default_action
        )

    def classify(self, ev: FaultEvent) -> Classified:
        e = self.entry(ev.vendor, ev.code)
        action = self.overrides.get(ev.code, e.action) if ev.vendor == "nvidia" else e.action
        return Classified(ev, e, action)

    def action_for(self, xid: int) -> str:
        return self.classify(FaultEvent("nvidia", str(xid), "", "")).action


@lru_cache(maxsize=4)
def _catalog_data(path: str) -> dict[str, Any]:
    data = read_yaml(path, "XID catalogue")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: XID catalogue must be a mapping")
    return data


def load_catalog(overrides: dict[int, str] | None = None, path: Path = CATALOG_PATH) -> XidCatalog:
    return XidCatalog(_catalog_data(str(path)), str(path), overrides)


def normalize_pci(pci: str) -> str:
    """`0000:53:00`, `0000:53:00.0` and NVML's `00000000:53:00.0` name the same GPU: `0000:53:00`."""
    parts = pci.strip().lower().split(".")[0].split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) < 3:
        return pci.strip().lower()
    dom = parts[-3]
    try:
        dom = f"{int(dom, 16):04x}"
    except ValueError:
        pass
    return ":".join([dom, *parts[-2:]])


def parse_line(line: str, aliases: dict[str, str] | None = None, source: str = "kmsg") -> FaultEvent | None:
    """The fault a kernel-log line reports, or None. Never raises."""
    if not line or len(line) > MAX_LINE:
        line = line[:MAX_LINE] if line else ""
    if not line or line[0] == " ":  # kmsg continuation lines ("SUBSYSTEM=pci") carry no fault
        return None
    ts: float | None = None
    msg = line.rstrip("\n")
    m = _KMSG.match(msg)
    if m:
        msg, ts = m.group("msg"), int(m.group("usec")) / 1e6
    else:
        d = _DMESG_TS.match(msg)
        if d:
            msg, ts = d.group("msg"), float(d.group("sec"))
    x = _XID.search(msg)
    if x:
        return FaultEvent(
            "nvidia", str(int(x.group("xid"))), normalize_pci(x.group("pci")), msg.strip(), ts, source
        )
    o = _OFF_BUS.search(msg)
    if o:
        code = (aliases or {}).get("GPU has fallen off the bus", "79")
        return FaultEvent("nvidia", code, normalize_pci(o.group("pci")), msg.strip(), ts, source)
    n = _NEURON.search(msg)
    if n:
        kv = {k.group("k"): k.group("v") for k in _KV.finditer(n.group("rest"))}
        dev = kv.get("nd-id") or kv.get("device") or ""
        return FaultEvent("neuron", n.group("code"), f"nd{dev}" if dev else "", msg.strip(), ts, source)
    return None


def parse_lines(lines: list[str], source: str = "kmsg") -> list[FaultEvent]:
    out = []
    for line in lines:
        ev = parse_line(line, source=source)
        if ev is not None:
            out.append(ev)
    return out
