"""Cloud notices of a reclaim or a maintenance: what is coming to this node, and by when.

A notice source is a Protocol registered by name (NOTICE_SOURCES; "ec2" reads instance metadata, see
agent/imds.py; a site adds its cloud's with `NOTICE_SOURCES.register` or the `hpresilience.notice_sources`
entry-point group). The agent asks each configured source once a cycle through a NoticeWatcher, which
1. turns a source off when its endpoint has never answered (not on that cloud: a node off EC2 must not pay
   a timeout every cycle) and asks it again every `reprobe_s`;
2. keeps only the notices that are due: a reclaim at once, a maintenance `maintenance_lead_s` before its start;
3. says whether every source that is on answered (`complete`): only then may "no notice" withdraw a drain,
   never because a metadata request timed out.
The node notice file (`write_notice_file`) is what hpresilience.torch's check_alive() watches; it is written
by the agent (root) into a directory only root may write, and trusted by the reader only if so.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpresilience.agent.settings import NoticeSettings
from hpresilience.errors import ConfigError
from hpresilience.fileio import atomic_write_text
from hpresilience.log import get_logger
from hpresilience.reasons import PlannedKind, iso_utc, planned_reason
from hpresilience.registry import Registry

log = get_logger("hpresilience.agent")


class NoticeUnavailable(Exception):
    """The source's endpoint did not answer (connection refused, timeout, an HTTP error): no news either way."""


@dataclass(frozen=True)
class Notice:
    kind: PlannedKind
    deadline: float  # epoch seconds (UTC): the reclaim, or the maintenance's earliest start
    detail: str  # short, one line, for the Slurm reason ("ec2 spot terminate")
    source: str
    key: str = ""  # identifies it across polls (EC2's EventId), for logs

    @property
    def reason(self) -> str:
        return planned_reason(self.kind, self.deadline, self.detail)


class NoticeSource(Protocol):
    """One cloud's notices for this node. `poll` returns what is announced now (bad entries skipped and
    logged by the source), or raises NoticeUnavailable; it never blocks past its own absolute timeout."""

    name: str

    def poll(self) -> Sequence[Notice]: ...


def _is_factory(obj: Any) -> None:
    if not callable(obj):
        raise TypeError("must be callable: (NoticeSettings) -> NoticeSource")


# name -> a factory taking the agent's notice settings.
NOTICE_SOURCES: Registry[Callable[[NoticeSettings], NoticeSource]] = Registry(
    "notice source",
    {"ec2": "hpresilience.agent.imds:Ec2NoticeSource"},
    validate=_is_factory,
    entry_point_group="hpresilience.notice_sources",
)


@dataclass(frozen=True)
class Poll:
    notices: tuple[Notice, ...]  # due now, earliest deadline first
    complete: bool  # every source that is on answered this time

    @property
    def first(self) -> Notice | None:
        return self.notices[0] if self.notices else None


@dataclass
class _State:
    source: NoticeSource
    answered: bool = False  # has it ever answered since the agent started
    off_until: float = float("-inf")  # monotonic time before which a source that never answered is not asked
    seen: set[str] = field(default_factory=set)


class NoticeWatcher:
    def __init__(self, settings: NoticeSettings, sources: Sequence[NoticeSource] | None = None) -> None:
        self.settings = settings
        if sources is None:  # an unknown name is a ConfigError naming the known ones (agent start: exit 2)
            try:
                sources = [NOTICE_SOURCES.get(name)(settings) for name in settings.sources]
            except ConfigError as err:
                raise ConfigError(f"agent.notices.sources: {err}") from None
        self.states = [_State(s) for s in sources]

    def poll(self, now: float, mono: float) -> Poll:
        """The due notices of every source that is on; `now` is wall-clock (deadlines), `mono` monotonic."""
        due: list[Notice] = []
        complete = True
        for st in self.states:
            if not st.answered and mono < st.off_until:
                continue  # off: this is not that cloud (asked again at off_until)
            try:
                found = list(st.source.poll())
            except NoticeUnavailable as err:
                if st.answered:
                    complete = False
                    log.warning("notice_poll_failed", source=st.source.name, error=str(err)[:200])
                else:
                    st.off_until = mono + self.settings.reprobe_s
                    log.info(
                        "notice_source_off",
                        source=st.source.name,
                        error=str(err)[:200],
                        retry_in_s=self.settings.reprobe_s,
                    )
                continue
            except Exception as err:  # noqa: BLE001 - a site's source must not end the agent's cycle
                complete = False
                log.error("notice_source_failed", source=st.source.name, error=str(err)[:200], kind=type(err).__name__)
                continue
            if not st.answered:
                log.info("notice_source_on", source=st.source.name)
            st.answered = True
            for n in found:
                if n.kind is PlannedKind.MAINTENANCE and n.deadline - now > self.settings.maintenance_lead_s:
                    if n.key not in st.seen:  # said once, not every cycle until it is due
                        st.seen.add(n.key)
                        log.info(
                            "notice_not_yet_due",
                            source=n.source,
                            kind=n.kind.value,
                            detail=n.detail,
                            deadline=iso_utc(n.deadline),
                            lead_s=self.settings.maintenance_lead_s,
                        )
                    continue
                due.append(n)
        due.sort(key=lambda n: (n.deadline, n.kind.value, n.detail))
        return Poll(tuple(due), complete)


def notice_document(n: Notice, node: str, now: float) -> str:
    """The notice file's content (JSON, one object): what, by when, where from. Readers need only its presence."""
    return (
        json.dumps(
            {
                "node": node,
                "kind": n.kind.value,
                "deadline": iso_utc(n.deadline),
                "detail": n.detail,
                "source": n.source,
                "reason": n.reason,
                "written_at": iso_utc(now),
            },
            sort_keys=True,
        )
        + "\n"
    )


def _safe_dir(d: Path) -> None:
    """Make `d` (0755) if absent; refuse one that is a link, not ours, or writable by others (OSError)."""
    try:
        d.mkdir(mode=0o755, parents=True)
        os.chmod(d, 0o755)  # the unit's UMask=0077 would leave it 0700: ranks (users) must see the file
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{d} is not a directory")
    if st.st_uid != os.geteuid():
        raise OSError(f"{d} belongs to uid {st.st_uid}, not to the agent")
    if st.st_mode & 0o022:
        raise OSError(f"{d} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")


def write_notice_file(path: str, text: str) -> bool:
    """Write the node notice (0644, atomically) unless it already says `text`; True when it was written.
    A directory others could write is refused: a notice file there would be forgeable."""
    p = Path(path)
    try:
        if p.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    _safe_dir(p.parent)
    atomic_write_text(p, text, mode=0o644)
    return True


def remove_notice_file(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
