"""The check framework's vocabulary: results, the Check base class, the check registry, and hardware paths.

A check is a small object with a name, a family, a kind (passive: cheap and safe while jobs run;
active: stresses hardware, only on idle or drained nodes), a timeout and `run()`. Every run ends in a
CheckResult; the runner (runner.py) enforces timeouts and turns errors into `unknown`.
"""

from __future__ import annotations

import enum
import glob
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, NoReturn, TypeVar

from pydantic import Field

from hpresilience.reasons import Action
from hpresilience.registry import Registry
from hpresilience.settings_base import Section


class Status(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"
    NOT_APPLICABLE = "not_applicable"


class Mode(str, enum.Enum):
    """What the agent does with a confirmed fault: act on it in Slurm, or only log and count what it would do."""

    OBSERVE = "observe"
    ENFORCE = "enforce"


class Kind(str, enum.Enum):
    PASSIVE = "passive"
    ACTIVE = "active"


@dataclass(frozen=True)
class CheckResult:
    """How one run of one check ended, with the numbers and lines that led there."""

    check: str
    family: str
    kind: Kind
    status: Status
    action: Action = Action.NONE
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    # Identifies the fault across runs and reboots ("xid:79:0000:53:00.0"); empty when there is none.
    key: str = ""
    # True: one sighting is enough (a counter that only moves on a real fault); False: confirm by repeating.
    certain: bool = False
    duration_s: float = 0.0
    # When the fault was first observed (event time), for detection latency; None when unknown.
    observed_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "family": self.family,
            "kind": self.kind.value,
            "status": self.status.value,
            "action": self.action.value,
            "reason": self.reason,
            "evidence": self.evidence,
            "key": self.key,
            "certain": self.certain,
            "duration_s": round(self.duration_s, 4),
            "observed_at": self.observed_at,
        }

    @property
    def asks_action(self) -> bool:
        """A failure that asks the node to be rebooted or replaced: what the agent's guard acts on."""
        return self.status == Status.FAIL and self.action != Action.NONE


class NotApplicable(Exception):
    """Raised by a check when its device or tool is absent and the profile does not require it."""


class RequiredMissing(Exception):
    """Raised by a check when its device or tool is absent although the profile requires it."""


class CheckOptions(Section):
    """Per-check settings from the profile and the config; subclasses add thresholds."""

    enabled: bool = True
    timeout_s: float | None = Field(default=None, gt=0)
    # The device family must be present: absence is a failure instead of "not applicable".
    required: bool = False
    # observe: the agent logs and counts what this check's faults would do and never acts on them (while
    # agent.mode is enforce for the others); enforce or unset: as agent.mode says (observe there wins).
    mode: Mode | None = None


@dataclass(frozen=True)
class HostPaths:
    """Roots for every hardware read: a tree laid out like the real one under another root reads the same."""

    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    dev: Path = Path("/dev")

    def sys(self, *parts: str) -> Path:
        return self.sysfs.joinpath(*parts)

    def proc(self, *parts: str) -> Path:
        return self.procfs.joinpath(*parts)

    def device(self, *parts: str) -> Path:
        return self.dev.joinpath(*parts)

    def glob(self, root: Path, pattern: str) -> list[Path]:
        return sorted(Path(p) for p in glob.glob(str(root / pattern)))


T = TypeVar("T")


@dataclass(frozen=True)
class Expectation:
    """The device counts the node's profile promises (`expect:` in a profile); None: it promises nothing.

    A check's own `expected` option wins over these; a promised count also means the device family must be
    there (absent devices then fail instead of being not applicable)."""

    gpus: int | None = None
    neuron_devices: int | None = None
    efa_devices: int | None = None


@dataclass
class CheckContext:
    """What every check may use: paths, commands, settings, on-disk state, and a per-run cache."""

    paths: HostPaths = field(default_factory=HostPaths)
    commands: dict[str, str] = field(default_factory=dict)
    state_dir: Path = Path("/var/lib/hpresilience/health")
    kernel_log: str = ""
    nvml: str = "auto"
    xid_overrides: dict[int, str] = field(default_factory=dict)
    reboots_before_replace: int = 2
    escalation_window_s: float = 14 * 86400.0
    expect: Expectation = field(default_factory=Expectation)
    # No post-boot or driver-change grace (`check --strict`, the controller's health gate): a repaired node
    # must show all its hardware now, not in five minutes.
    strict: bool = False
    _cache: dict[str, tuple[float, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _key_locks: dict[str, threading.Lock] = field(default_factory=dict)

    def command(self, name: str) -> str:
        return self.commands.get(name, name.replace("_", "-") if name in ("nvidia_smi", "stress_ng") else name)

    def cached(self, key: str, fn: Callable[[], T], max_age_s: float = 2.0) -> T:
        """One read shared by the checks of one run (several GPU checks, one NVML snapshot)."""
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            hit = self._cache.get(key)
            if hit is not None and time.monotonic() - hit[0] <= max_age_s:
                value: T = hit[1]
                return value
            value = fn()
            self._cache[key] = (time.monotonic(), value)
            return value

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    def boot_id(self) -> str:
        """Identifies the current boot (escalation counts reboots by it)."""
        try:
            text = self.paths.proc("sys", "kernel", "random", "boot_id").read_text().strip()
            if text:
                return text
        except OSError:
            pass
        try:
            for line in self.paths.proc("stat").read_text().splitlines():
                if line.startswith("btime "):
                    return "btime-" + line.split()[1]
        except OSError:
            pass
        return "unknown-boot"

    def state_path(self, name: str) -> Path:
        return self.state_dir / name


OptionsT = TypeVar("OptionsT", bound=CheckOptions)


class Check(Generic[OptionsT]):
    """Base class of every check, generic over its options model `OptionsT`. Subclasses set the class attributes
    (`Options` is `OptionsT` itself: the profile's options are validated against it) and implement `run()`."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    kind: ClassVar[Kind] = Kind.PASSIVE
    default_timeout_s: ClassVar[float] = 10.0
    Options: ClassVar[type[CheckOptions]] = CheckOptions

    def __init__(self, options: OptionsT, ctx: CheckContext) -> None:
        self.options = options
        self.ctx = ctx

    @property
    def timeout_s(self) -> float:
        return self.options.timeout_s or self.default_timeout_s

    def run(self) -> CheckResult:
        raise NotImplementedError

    # Helpers so that run() reads as its outcome.
    def result(
        self,
        status: Status,
        reason: str,
        action: Action = Action.NONE,
        key: str = "",
        certain: bool = False,
        evidence: dict[str, Any] | None = None,
        **more: Any,
    ) -> CheckResult:
        return CheckResult(
            self.name,
            self.family,
            self.kind,
            status,
            action,
            reason,
            {**(evidence or {}), **more},
            key,
            certain,
        )

    def ok(self, reason: str, evidence: dict[str, Any] | None = None, **more: Any) -> CheckResult:
        return self.result(Status.OK, reason, evidence=evidence, **more)

    def warn(self, reason: str, key: str = "", evidence: dict[str, Any] | None = None, **more: Any) -> CheckResult:
        return self.result(Status.WARN, reason, key=key, evidence=evidence, **more)

    def fail(
        self,
        reason: str,
        action: Action,
        key: str,
        certain: bool,
        evidence: dict[str, Any] | None = None,
        **more: Any,
    ) -> CheckResult:
        return self.result(Status.FAIL, reason, action, key, certain, evidence=evidence, **more)

    def finding(
        self, what: str, action: Action, key: str, certain: bool, detail: dict[str, Any] | None = None
    ) -> CheckResult:
        """One thing wrong inside a run, as a result of its own: a failure when it asks for an action, else a
        warning. A check that finds several reports the worst (checks.common.report) and lists them all."""
        status = Status.FAIL if action != Action.NONE else Status.WARN
        return self.result(status, what, action, key, certain, evidence=detail)

    def absent(self, what: str) -> NoReturn:
        """The device or tool is absent: not applicable, unless the profile requires it (then a failure)."""
        if self.options.required:
            raise RequiredMissing(what)
        raise NotApplicable(what)


# Every check by name. Filled by the check modules' @register as they are imported; importing
# `hpresilience.health.checks` imports the built-in ones (this module does not: the checks build on it).
AnyCheck = Check[Any]
CHECKS: Registry[type[AnyCheck]] = Registry("check")
C = TypeVar("C", bound=type[AnyCheck])


def register(cls: C) -> C:
    """Class decorator: make a check available to profiles by its name."""
    if not cls.name or not cls.family:
        raise TypeError(f"{cls.__name__} must set name and family")
    CHECKS.register(cls.name, cls)
    return cls


def read_text(path: Path, default: str | None = None) -> str | None:
    """A sysfs/procfs value, stripped; `default` when the file is absent or unreadable."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return default


def read_int(path: Path) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.split()[0], 0) if text else None
    except ValueError:
        return None
