"""structlog set-up: human-readable on a terminal, JSON lines otherwise.

Daemons log facts as event names (`node_marked_fail`, `step_relaunched`) with key/value
context; journald and log shippers read the JSON form.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, Literal, TextIO

import structlog
from pydantic import Field
from structlog.typing import FilteringBoundLogger

from hpresilience.settings_base import Section

_configured = False
# A log level by name, as the `logging:` section and a call that picks its level (`Logger.log`) spell it.
Level = Literal["debug", "info", "warning", "error"]
# The logger every part gets: structlog's filtering bound logger, so each call is type-checked.
Logger = FilteringBoundLogger


class LoggingSettings(Section):
    level: Level = "info"
    # None: JSON when stderr is not a terminal (journald, log shippers), readable otherwise.
    json_lines: bool | None = Field(default=None, alias="json")


class _CurrentStderr:
    """Writes to whatever sys.stderr is at the time of the call (pytest's capture, a redirected fd)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def setup_logging(level: str = "info", json: bool | None = None, stream: TextIO | None = None) -> None:
    """Configure structlog once per process (later calls re-configure)."""
    global _configured
    if json is None:
        json = not (stream if stream is not None else sys.stderr).isatty()
    out: Any = stream if stream is not None else _CurrentStderr()
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json:
        processors += [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=False)]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    _configured = True


def get_logger(name: str | None = None, **context: Any) -> Logger:
    """A bound structlog logger; configures JSON-on-stderr defaults if nobody did."""
    if not _configured:
        setup_logging()
    # structlog types get_logger as Any: the wrapper class set in setup_logging is a filtering bound logger.
    log: Logger = structlog.get_logger(name)
    return log.bind(**context) if context else log


def level_number(level: Level) -> int:
    """The number `Logger.log` takes for a level name."""
    return logging.getLevelNamesMapping()[level.upper()]


# C0 and C1 controls, DEL, and the Unicode line/paragraph separators and bidi overrides a terminal or a
# pager acts on: text a user wrote (a ledger's cause, a node name, an event's reason) printed to root's
# terminal must not move the cursor, retitle the window, or start a line that looks like ours.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object, keep_newlines: bool = False) -> str:
    """`text` with every control character shown as a visible escape (`\\x1b`, `\\n`, `\\u202e`); with
    `keep_newlines`, newlines and tabs stay (a whole report of ours, whose lines are its structure)."""

    def esc(m: re.Match[str]) -> str:
        c = m.group()
        if keep_newlines and c in "\n\t":
            return c
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (
            f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
        )

    return _UNPRINTABLE.sub(esc, str(text))
