"""Node reasons: the vocabulary the agent, the controller, the wrapper and operators share through Slurm.

HyperPod's convention, which operators already type by hand:
    scontrol update node=X state=fail reason="Action:Replace"
    scontrol update node=X state=fail reason="Action:Reboot"
Anything after the action word is free text. Reasons that hpresilience itself writes carry an owner
tag, so that a part never overwrites or resumes a reason a person (or another tool) set:
    Action:Replace [hpr-agent] xid=79 GPU 0000:53:00.0 fell off the bus
    [hpr-controller] repairing: reboot (attempt 1)
A node the controller leaves for a person (a lemon: repaired too often) starts with `hpr: needs a person`,
which reads as the controller's: nothing of ours picks it up or resumes it, and it counts against the ceiling.

A planned drain (the cloud announced a reclaim or a maintenance; issue 25) is the agent's, without an action:
    [hpr-agent] Planned:Reclaim by 2026-11-25T20:10:00Z ec2 spot terminate
    [hpr-agent] Planned:Maintenance by 2026-11-28T09:00:00Z ec2 system-reboot: scheduled reboot
No `Action:` word, so the controller never repairs it; the deadline is ISO 8601 UTC to the second. The
agent also writes the same notice to NODE_NOTICE_FILE, which `hpresilience.torch.check_alive()` watches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum, StrEnum


class Action(StrEnum):
    """What a fault asks of the node, from a check's result to the Slurm reason: the one scale of severity.

    The value is the lower-case word of `hpresilience check --json` and of the controller's ladder; the
    Slurm reason spells it capitalised (`reason_word`), as HyperPod's operators type it. A StrEnum, so that
    it formats as its word wherever it is written out (a provider's result line, a site script's argument).
    """

    NONE = "none"
    REBOOT = "reboot"
    REPLACE = "replace"

    @property
    def rank(self) -> int:
        """none < reboot < replace: every choice of the worst fault (verdict, a check's sub-results, the
        agent's guard) orders by this and nothing else."""
        return _RANK[self]

    @property
    def reason_word(self) -> str:
        """The word after `Action:` in a Slurm reason ("Replace", "Reboot")."""
        return self.value.capitalize()


_RANK = {Action.NONE: 0, Action.REBOOT: 1, Action.REPLACE: 2}


AGENT_TAG = "[hpr-agent]"
CONTROLLER_TAG = "[hpr-controller]"
PERSON_PREFIX = "hpr: needs a person"

_ACTION = re.compile(r"^\s*Action\s*:\s*(Replace|Reboot)\b", re.IGNORECASE)
# Where agent_reason/controller_reason put the tag: first, or right after the action word. A tag anywhere
# else is someone's text (an operator quoting ours), and must not hand the node to one of our parts.
_OWNER = re.compile(r"^\s*(?:Action\s*:\s*(?:Replace|Reboot)\b\s*)?(\[hpr-agent\]|\[hpr-controller\])", re.IGNORECASE)
_PERSON = re.compile(r"^\s*(hpr:)(?=\s*needs a person)", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedReason:
    # None when the reason has no `Action:` word; never Action.NONE (a str enum member is always truthy).
    action: Action | None
    owner: str | None  # "agent", "controller", or None for an operator / another tool
    detail: str


def parse_reason(reason: str) -> ParsedReason:
    """What a node's reason asks for and who wrote it. Case-insensitive on the action word."""
    text = reason or ""
    m = _ACTION.match(text)
    action = Action(m.group(1).lower()) if m else None
    tag = _OWNER.match(text) or _PERSON.match(text)
    owner = None if tag is None else "agent" if tag.group(1).lower() == AGENT_TAG else "controller"
    detail = text[tag.end() :] if tag else text[m.end() :] if m else text
    detail = detail.strip(" :-")
    return ParsedReason(action, owner, detail)


class PlannedKind(str, Enum):
    """What is coming to a node that the cloud announced: the word after `Planned:` in its reason."""

    RECLAIM = "Reclaim"  # the instance is taken away (EC2 spot terminate / stop / hibernate)
    MAINTENANCE = "Maintenance"  # a scheduled event (reboot, retirement, stop) with a start time


# Where the agent writes the node notice (root-owned /run/hpresilience, mode 0755; the file 0644, JSON):
# hpresilience.torch's PreemptionConfig.notice_file defaults to it, and trusts it only when root owns both.
NODE_NOTICE_FILE = "/run/hpresilience/notice.json"

_PLANNED = re.compile(
    r"^\s*\[hpr-agent\]\s*Planned\s*:\s*(\w+)\s+by\s+(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\s*(.*)$",
    re.IGNORECASE | re.DOTALL,
)


@dataclass(frozen=True)
class PlannedReason:
    kind: PlannedKind
    deadline: float  # epoch seconds (UTC)
    detail: str


def iso_utc(epoch: float) -> str:
    """2026-11-25T20:10:00Z: the deadline as every reason and notice file spells it."""
    return datetime.fromtimestamp(int(epoch), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def planned_reason(kind: PlannedKind, deadline: float, detail: str) -> str:
    """The reason of a planned drain: the agent's, no action word (nothing to repair), kind and deadline first."""
    return _clip(f"{AGENT_TAG} Planned:{kind.value} by {iso_utc(deadline)} {detail}")


def parse_planned(reason: str) -> PlannedReason | None:
    """Kind, deadline and detail of a planned-drain reason the agent wrote; None for any other reason (an
    operator's text that merely mentions `Planned:` is not one: the agent's tag must come first)."""
    m = _PLANNED.match(reason or "")
    if m is None:
        return None
    kind = next((k for k in PlannedKind if k.value.lower() == m.group(1).lower()), None)
    if kind is None:
        return None
    try:
        at = datetime.strptime(m.group(2).upper(), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return PlannedReason(kind, at.timestamp(), m.group(3).strip())


def agent_reason(action: Action, detail: str) -> str:
    """The reason the agent writes; Slurm keeps reasons short, so the detail is trimmed."""
    if action is Action.NONE:
        raise ValueError("a reason the agent writes asks for an action")
    return _clip(f"Action:{action.reason_word} {AGENT_TAG} {detail}")


def controller_reason(detail: str, action: Action | None = None) -> str:
    prefix = f"Action:{action.reason_word} " if action not in (None, Action.NONE) else ""
    return _clip(f"{prefix}{CONTROLLER_TAG} {detail}")


def person_reason(detail: str) -> str:
    """The reason of a node left for a person: no Action word (nothing picks it up), the controller's."""
    return _clip(f"{PERSON_PREFIX}: {detail}")


def _clip(text: str, limit: int = 200) -> str:
    # Quotes and newlines would break `scontrol update reason=...` parsing on the Slurm side.
    clean = " ".join(text.replace('"', "'").split())
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."
