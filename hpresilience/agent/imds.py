"""The EC2 notice source: spot interruptions and scheduled events from instance metadata (IMDSv2).

    PUT  /latest/api/token                               X-aws-ec2-metadata-token-ttl-seconds: 60
    GET  /latest/meta-data/spot/instance-action          404: none; {"action": "terminate", "time": "...Z"}
    GET  /latest/meta-data/events/maintenance/scheduled  [{"Code", "Description", "EventId", "NotBefore",
                                                           "NotAfter", "State"}], NotBefore "21 Jan 2019 09:00:43 GMT"
Both GETs carry the token (X-aws-ec2-metadata-token). A spot action is a reclaim due at its `time`; a scheduled
event is a maintenance due at its NotBefore, unless it is completed or canceled (State, or a Description that
starts with "[Completed]"/"[Canceled]", as EC2 keeps them listed for a week). Parsers are pure; an entry that
does not parse (or a hostile one: an unknown action, a date out of range, text that is not JSON) is skipped
and logged. The requests are hpresilience/imds.py's, shared with the training library's spot poll: each ends
within `timeout_s` in all, so a poll takes at most 3 x timeout_s, and an answer over 64 KiB is not read on.
A request that fails fails the poll (NoticeUnavailable, which the watcher takes as no news, never as a
withdrawal).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from hpresilience.agent.notices import Notice, NoticeUnavailable
from hpresilience.agent.settings import NoticeSettings
from hpresilience.imds import EVENTS_PATH, SPOT_PATH, MetadataClient, MetadataUnavailable
from hpresilience.log import get_logger
from hpresilience.reasons import PlannedKind

log = get_logger("hpresilience.agent")

SPOT_ACTIONS = ("terminate", "stop", "hibernate")
DONE_STATES = ("completed", "canceled", "cancelled")
_CODE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def _date(text: Any) -> float | None:
    """Epoch seconds of an IMDS date: ISO 8601 UTC ("2026-11-25T20:10:00Z") or the events' "21 Jan 2019
    09:00:43 GMT"; None for anything else or a year out of 2000..2200."""
    if not isinstance(text, str) or len(text) > 40:
        return None
    s = text.strip()
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ", "%d %b %Y %H:%M:%S GMT", "%d %b %Y %H:%M:%S %Z"):
        try:
            at = datetime.strptime(s, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
        return at.timestamp() if 2000 <= at.year <= 2200 else None
    return None


def _clean(text: Any, limit: int = 80) -> str:
    """One short printable line of metadata text, for a Slurm reason."""
    out = _PRINTABLE.sub(" ", text if isinstance(text, str) else "")
    out = " ".join(out.split())
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _json(body: bytes | str, what: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        log.warning(
            "notice_unreadable",
            source="ec2",
            what=what,
            error=str(err)[:120],
            body=_clean(body[:200] if isinstance(body, str) else body[:200].decode("latin-1"), 200),
        )
        return None


def parse_instance_action(body: bytes | str) -> list[Notice]:
    """`spot/instance-action` -> one reclaim notice, or none when the document does not parse."""
    doc = _json(body, "spot/instance-action")
    if doc is None:
        return []
    action = doc.get("action") if isinstance(doc, dict) else None
    at = _date(doc.get("time")) if isinstance(doc, dict) else None
    if action not in SPOT_ACTIONS or at is None:
        log.warning(
            "notice_skipped",
            source="ec2",
            what="spot/instance-action",
            why="expected {action: terminate|stop|hibernate, time: ISO 8601 UTC}",
            doc=_clean(str(doc), 200),
        )
        return []
    return [Notice(PlannedKind.RECLAIM, at, f"ec2 spot {action}", "ec2", f"spot:{action}:{int(at)}")]


def parse_scheduled_events(body: bytes | str) -> list[Notice]:
    """`events/maintenance/scheduled` -> a maintenance notice per event that is still to come."""
    doc = _json(body, "events/maintenance/scheduled")
    if isinstance(doc, dict):
        doc = [doc]  # a single object where a list is documented: read it as a list of one
    if not isinstance(doc, list):
        if doc is not None:
            log.warning("notice_skipped", source="ec2", what="events/maintenance/scheduled", why="not a list")
        return []
    out: list[Notice] = []
    for ev in doc[:50]:
        if not isinstance(ev, dict):
            log.warning("notice_skipped", source="ec2", what="scheduled event", why="not an object")
            continue
        state = ev.get("State")
        desc = _clean(ev.get("Description"))
        if (isinstance(state, str) and state.strip().lower() in DONE_STATES) or desc.lower().startswith(
            ("[completed]", "[canceled]", "[cancelled]")
        ):
            continue
        code = ev.get("Code")
        at = _date(ev.get("NotBefore"))
        if not isinstance(code, str) or not _CODE.match(code) or at is None:
            log.warning(
                "notice_skipped",
                source="ec2",
                what="scheduled event",
                why="expected Code (e.g. system-reboot) and NotBefore ('21 Jan 2019 09:00:43 GMT')",
                entry=_clean(str(ev), 200),
            )
            continue
        key = _clean(ev.get("EventId"), 64) or f"{code}:{int(at)}"
        detail = f"ec2 {code}: {desc}" if desc else f"ec2 {code}"
        out.append(Notice(PlannedKind.MAINTENANCE, at, detail, "ec2", key))
    return out


class Ec2NoticeSource:
    """IMDSv2: a session token, then the two documents. Raises NoticeUnavailable when the endpoint is not there."""

    name = "ec2"

    def __init__(self, settings: NoticeSettings) -> None:
        self.client = MetadataClient(settings.ec2_endpoint, settings.timeout_s, "agent.notices.ec2_endpoint")

    def poll(self) -> Sequence[Notice]:
        try:
            token = self.client.token()
            found: list[Notice] = []
            spot = self.client.get(SPOT_PATH, token)
            if spot is not None:
                found += parse_instance_action(spot)
            events = self.client.get(EVENTS_PATH, token)
            if events is not None:
                found += parse_scheduled_events(events)
        except MetadataUnavailable as err:
            raise NoticeUnavailable(str(err)) from None
        return found
