"""The XID catalogue, and reading faults out of kernel-log lines.

Lines come in several shapes, all handled by `KernelLogParser` (and `parse_line` for one line):
  /dev/kmsg:  `4,1234,5678901,-;NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has...`
  dmesg:      `[ 5678.901234] NVRM: Xid (PCI:0000:53:00): 79, pid=...`  (also -T, iso, syslog, journal prefixes)
  NVSwitch:   `nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up`
  Neuron:     `NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-... nd-id=0 ... action=TERMINATE_INSTANCE`
Every pattern is anchored on the driver's own prefix at the start of the message: a fault string quoted
inside another record (an audit line's `exe="..."`) is not a fault. A hostile or garbled line never raises.

Any user can write lines into the kernel log: the segfault report prints a crashing program's name raw,
newlines included, so `u<newline>NVRM: Xid (...): 79, ...` puts a driver-looking line *inside* the kernel's own
record. A record is a driver message only if its own first line is one the driver prints; its further lines
(kmsg `\\x0a`, lines that dmesg and journalctl indent, lines that `dmesg -S` and syslog files fed from
/proc/kmsg repeat the record's stamp on) never are a fault of their own: they only end the driver's
off-the-bus report begun on the record's first line.
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
# A sub-second stamp (`[ 5678.901234]`, dmesg's iso time): shapes that print it on every line of a record
# (dmesg -S, syslog files fed from /proc/kmsg) repeat the record's own on each of its lines.
_FINE_STAMP = re.compile(r"\[\s*\d+\.\d{3,}\]|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[.,]\d{3,}\S*")
# Where a driver's own message begins. Every fault pattern below is matched only at such a point, and only
# when what precedes it is a log prefix (timestamps, host, the `kernel:` tag): a user-controlled string
# quoted inside another record (an audit `exe="..."`, a `logger` line) can never count as a fault.
_ANCHOR = re.compile(r"NVRM: |nvidia-nvswitch\d+: |NEURON_HW_ERR=")
_XID = re.compile(r"^NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d{1,4})\b,?\s*(?P<rest>.*)$")
_OFF_BUS = re.compile(
    r"^NVRM: GPU (?:at PCI:)?(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}[.0-9]*):? "
    r"GPU has fallen off the bus"
)
# Driver 570+ splits the off-the-bus report over three records and prints no XID:
#   NVRM: The NVIDIA GPU 0000:b3:00.0 / NVRM: (PCI ID: 10de:26b5) installed in this system has /
#   NVRM: fallen off the bus and is not responding to commands.
_OFF_BUS_HEAD = re.compile(r"^NVRM: The NVIDIA GPU (?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}[.0-9]*)\s*$")
_OFF_BUS_MID = re.compile(r"^NVRM: \(PCI ID: [0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}\) installed in this system has\s*$")
_OFF_BUS_TAIL = re.compile(r"^NVRM: fallen off the bus and is not responding to commands")
_SXID = re.compile(
    r"^nvidia-nvswitch(?P<sw>\d+): SXid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d{1,6}),\s*"
    r"(?P<rest>.*)$"
)
_NEURON = re.compile(r"^NEURON_HW_ERR=(?P<code>[A-Z0-9_]+)(?=\s|$)(?P<rest>.*)$")
# NVLink5 XIDs (144-150) and SXids say in the line whether the error was fatal.
_SEVERITY = re.compile(r"^(?:\S+\s+)?(?P<sev>Nonfatal|Non-fatal|Fatal)\b", re.IGNORECASE)
_TS_TOKEN = re.compile(r"[0-9][0-9\-T:.,+Z]*")
_LOG_LEVELS = {"emerg", "alert", "crit", "err", "error", "warn", "warning", "notice", "info", "debug"}
_KERNEL_TAGS = {"kernel", "kern"}
_KV = re.compile(r"(?P<k>[a-z][a-z_-]*)=(?P<v>\S+)")


@dataclass(frozen=True)
class XidEntry:
    code: str  # "79", "SRAM_UNCORRECTABLE_ERROR", or an SXid "20034"
    name: str
    action: str
    # For errors whose line says Fatal or Nonfatal (NVLink5 XIDs 144-150, SXids): the action when Nonfatal.
    nonfatal_action: str | None = None


@dataclass(frozen=True)
class FaultEvent:
    """One fault line (or NVML event): vendor "nvidia", "nvswitch" or "neuron", a code, and its device."""

    vendor: str
    code: str
    device: str  # PCI bus id for NVIDIA ("0000:53:00"), "nd<N>" for Neuron, "" when the line names none
    message: str
    timestamp: float | None = None  # seconds since boot (kmsg/dmesg) or epoch (NVML), when known
    source: str = "kmsg"
    # "fatal" / "nonfatal" where the line says so (NVLink5 XIDs, SXids); "" otherwise.
    severity: str = ""

    @property
    def key(self) -> str:
        # A Nonfatal sighting is a different fault from a Fatal one: it must not climb the fatal ladder.
        suffix = ":nonfatal" if self.severity == "nonfatal" else ""
        return f"{self.vendor}:{self.code}:{self.device}{suffix}"


@dataclass(frozen=True)
class Classified:
    event: FaultEvent
    entry: XidEntry
    action: str  # after overrides


def _entries(data: dict[str, Any], section: str) -> dict[str, XidEntry]:
    out = {}
    for k, v in (data.get(section) or {}).items():
        nf = v.get("nonfatal_action")
        out[str(k)] = XidEntry(str(k), str(v["name"]), str(v["action"]), None if nf is None else str(nf))
    return out


class XidCatalog:
    def __init__(self, data: dict[str, Any], source: str, overrides: dict[int, str] | None = None) -> None:
        self.source = source
        try:
            self.version = str(data["version"])
            self.default_action = str(data.get("default_action", "warn"))
            self.nvidia = _entries(data, "nvidia")
            self.neuron = _entries(data, "neuron")
            self.nvswitch = _entries(data, "nvswitch")
            sx = data.get("nvswitch_default") or {}
            self.sxid_fatal = str(sx.get("fatal", "reboot_then_replace"))
            self.sxid_nonfatal = str(sx.get("nonfatal", "warn"))
            self.aliases = {str(k): str(v) for k, v in (data.get("aliases") or {}).items()}
        except (KeyError, TypeError, AttributeError) as err:
            raise ConfigError(f"{source}: malformed XID catalogue: {err}") from None
        entries = [*self.nvidia.values(), *self.neuron.values(), *self.nvswitch.values()]
        for e in entries:
            for a in (e.action, e.nonfatal_action or "none"):
                if a not in ACTIONS:
                    raise ConfigError(f"{source}: XID {e.code}: action {a!r} is not one of {', '.join(ACTIONS)}")
        for a in (self.default_action, self.sxid_fatal, self.sxid_nonfatal):
            if a not in ACTIONS:
                raise ConfigError(f"{source}: default action {a!r} is not one of {', '.join(ACTIONS)}")
        self.overrides = {str(k): v for k, v in (overrides or {}).items()}
        for k, v in self.overrides.items():
            if v not in ACTIONS:
                raise ConfigError(f"health.xid_overrides.{k}: {v!r} is not one of {', '.join(ACTIONS)}")

    def entry(self, vendor: str, code: str, severity: str = "") -> XidEntry:
        table = {"nvidia": self.nvidia, "nvswitch": self.nvswitch}.get(vendor, self.neuron)
        found = table.get(code)
        if found is not None:
            return found
        if vendor == "nvswitch":
            # NVIDIA's SXid catalogue: a Fatal SXid needs the NVSwitch (and its GPUs) reset, in practice a
            # reboot; a Non-fatal one is corrected in hardware and only worth watching.
            action = {"fatal": self.sxid_fatal, "nonfatal": self.sxid_nonfatal}.get(severity, "warn")
            return XidEntry(code, "unlisted SXid", action, self.sxid_nonfatal)
        return XidEntry(code, "unlisted XID" if vendor == "nvidia" else "unlisted Neuron error", self.default_action)

    def classify(self, ev: FaultEvent) -> Classified:
        e = self.entry(ev.vendor, ev.code, ev.severity)
        action = e.action
        if ev.severity == "nonfatal" and e.nonfatal_action is not None:
            action = e.nonfatal_action
        if ev.vendor == "nvidia":
            action = self.overrides.get(ev.code, action)
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


def _is_log_prefix(prefix: str) -> bool:
    """True when `prefix` is only what loggers put before a kernel message (time, host, `kernel:`, level).

    Quoting (`exe="..."`), key=value pairs and audit records are never a prefix; a host or program name
    counts only with the kernel's own tag (`host kernel:`), so `logger` lines from users do not pass.
    """
    if not prefix.strip():
        return True
    if "=" in prefix or '"' in prefix or "'" in prefix or "audit" in prefix.lower():
        return False
    tokens = re.sub(r"\[[^\[\]]*\]:?", " ", prefix).split()
    tagged = named = False
    for raw in tokens:
        t = raw.strip(":")
        if not t or _TS_TOKEN.fullmatch(t):
            continue
        low = t.lower()
        if low in _KERNEL_TAGS:
            tagged = True
        elif low in _LOG_LEVELS:
            continue
        elif tagged or not re.fullmatch(r"[A-Za-z0-9][\w.\-]*", t):
            return False  # after `kernel:` only a level or a timestamp may come
        else:
            named = True
    return tagged or not named


def _body(msg: str) -> str | None:
    """The message from a driver's anchor on, or None when no anchor follows a plain log prefix."""
    m = _ANCHOR.search(msg)
    if m is None or not _is_log_prefix(msg[: m.start()]):
        return None
    return msg[m.start() :]


def _severity(rest: str) -> str:
    s = _SEVERITY.match(rest)
    if s is None:
        return ""
    return "fatal" if s.group("sev").lower() == "fatal" else "nonfatal"


def _split_record(line: str) -> tuple[str, float | None, bool, bool]:
    """(message, timestamp, from_kernel, is_kmsg) of one kmsg/dmesg/syslog line."""
    m = _KMSG.match(line)
    if m:
        # Records a user process writes to /dev/kmsg carry a non-kernel facility (prio >= 8).
        return m.group("msg"), int(m.group("usec")) / 1e6, int(m.group("prio")) < 8, True
    d = _DMESG_TS.match(line)
    if d:
        return d.group("msg"), float(d.group("sec")), True, False
    return line, None, True, False


def _stamp(line: str) -> str | None:
    """The sub-second stamp in a line's log prefix, or None (none there, or only in the message)."""
    m = _FINE_STAMP.search(line, 0, 120)
    if m is None or not _is_log_prefix(line[: m.start()]):
        return None
    return m.group()


def _parse_body(body: str, ts: float | None, aliases: dict[str, str] | None, source: str) -> FaultEvent | None:
    x = _XID.match(body)
    if x:
        return FaultEvent(
            "nvidia",
            str(int(x.group("xid"))),
            normalize_pci(x.group("pci")),
            body.strip(),
            ts,
            source,
            _severity(x.group("rest")),
        )
    o = _OFF_BUS.match(body)
    if o:
        code = (aliases or {}).get("GPU has fallen off the bus", "79")
        return FaultEvent("nvidia", code, normalize_pci(o.group("pci")), body.strip(), ts, source)
    sx = _SXID.match(body)
    if sx:
        return FaultEvent(
            "nvswitch",
            str(int(sx.group("code"))),
            normalize_pci(sx.group("pci")),
            body.strip(),
            ts,
            source,
            _severity(sx.group("rest")),
        )
    n = _NEURON.match(body)
    if n:
        kv = {k.group("k"): k.group("v") for k in _KV.finditer(n.group("rest"))}
        dev = kv.get("nd-id") or kv.get("device") or ""
        return FaultEvent("neuron", n.group("code"), f"nd{dev}" if dev else "", body.strip(), ts, source)
    return None


class KernelLogParser:
    """Reads fault events out of kernel-log lines in order, joining reports split over several records."""

    def __init__(self, aliases: dict[str, str] | None = None, source: str = "kmsg") -> None:
        self.aliases = aliases
        self.source = source
        self._off_bus_pci: str | None = None  # "The NVIDIA GPU <pci>" seen, waiting for its last line
        self._driver = False  # the current record's first line is one the driver prints
        self._ts: float | None = None  # the current record's time
        self._stamp: str | None = None  # its sub-second stamp as printed, where the shape repeats it

    def feed(self, line: str) -> list[FaultEvent]:
        """The faults this line completes (usually none or one). Never raises."""
        out: list[FaultEvent] = []
        # A /dev/kmsg read is one record followed by its " KEY=value" dictionary lines.
        for physical in line[:MAX_LINE].split("\n"):
            out += self._line(physical.rstrip("\r"))
        return out

    def _line(self, line: str) -> list[FaultEvent]:
        if not line.strip():
            return []
        if line[0] in " \t":
            # dmesg and journalctl print a record's further lines indented; kmsg its dictionary lines.
            return self._further(line)
        msg, ts, kernel, kmsg = _split_record(line)
        stamp = None if kmsg else _stamp(line)
        if stamp is not None and stamp == self._stamp and not self._driver:
            # dmesg -S, and syslog files fed from /proc/kmsg, print each line of a record with the record's
            # own stamp: the same microsecond right after a record that is not the driver's is that record's
            # next line (a crashing program's name), not a record of its own. (Two records of one microsecond,
            # the first not the driver's, lose the second: none in the field recordings.)
            return []
        self._stamp, self._ts, self._driver = stamp, ts, False
        if not kernel:
            return []
        # Only /dev/kmsg escapes a record's newlines, as \x0a (and a backslash as \x5c, so a name cannot spell
        # one); elsewhere a literal "\x0a" is text a user wrote.
        first, *further = msg.split("\\x0a") if kmsg else [msg]
        body = _body(first)
        out = self._first(body) if body is not None else []
        for part in further:
            out += self._further(part)
        return out

    def _first(self, body: str) -> list[FaultEvent]:
        """A record's first line, from the driver's prefix on; marks the record the driver's if it is."""
        head = _OFF_BUS_HEAD.match(body)
        if head:
            self._off_bus_pci, self._driver = head.group("pci"), True
            return []
        if _OFF_BUS_MID.match(body):
            self._driver = True
            return []
        out = self._off_bus_end(body)
        if not out:
            ev = _parse_body(body, self._ts, self.aliases, self.source)
            out = [ev] if ev is not None else []
        self._driver = bool(out)
        return out

    def _further(self, text: str) -> list[FaultEvent]:
        """A further line of the current record: at most the end of the driver's own off-the-bus report."""
        return self._off_bus_end(text.strip()) if self._driver else []

    def _off_bus_end(self, body: str) -> list[FaultEvent]:
        if self._off_bus_pci is None or not _OFF_BUS_TAIL.match(body):
            return []
        code = (self.aliases or {}).get("GPU has fallen off the bus", "79")
        pci, self._off_bus_pci = self._off_bus_pci, None
        return [FaultEvent("nvidia", code, normalize_pci(pci), body.strip(), self._ts, self.source)]


def parse_line(line: str, aliases: dict[str, str] | None = None, source: str = "kmsg") -> FaultEvent | None:
    """The fault a single kernel-log line reports, or None. Never raises."""
    events = KernelLogParser(aliases, source).feed(line)
    return events[0] if events else None


def parse_lines(lines: list[str], source: str = "kmsg") -> list[FaultEvent]:
    parser = KernelLogParser(source=source)
    return [ev for line in lines for ev in parser.feed(line)]
