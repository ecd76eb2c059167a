"""Required literals of a regular expression, used to skip lines a pattern cannot match.

`str.find` runs in C at memory speed, while `re.match` of a HyperPod-style `.*foo.*` pattern walks the
whole line; finding the longest literal every match must contain lets the rule engine run the regex
only on lines that contain it. The answer is always safe: "" (no prefilter) whenever unsure.
"""

from __future__ import annotations

import re
from typing import Any

try:  # Python's own regex parser; private, so any surprise simply disables the prefilter.
    from re import _constants as _c  # type: ignore[attr-defined]
    from re import _parser as _p  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - other interpreters
    _p = None
    _c = None


def required_literal(pattern: str) -> str:
    """The longest substring every match of `pattern` must contain, or "" if none can be proven."""
    if _p is None or _c is None:
        return ""
    try:
        parsed = _p.parse(pattern, 0)
        flags = re.compile(pattern).flags
    except Exception:  # noqa: BLE001 - any parser oddity means "no prefilter", never an error
        return ""
    if flags & re.IGNORECASE:
        return ""
    runs: list[str] = []
    try:
        current = _walk(parsed, runs, "")
    except Exception:  # noqa: BLE001
        return ""
    runs.append(current)
    return max(runs, key=len)


def _walk(seq: Any, runs: list[str], current: str) -> str:
    """Append finished literal runs of a sequence to `runs`; return the run still open at its end."""
    for op, av in seq:
        if op is _c.LITERAL:
            current += chr(av)
        elif op is _c.SUBPATTERN:
            _group, add_flags, _del_flags, sub = av
            if add_flags & re.IGNORECASE:
                runs.append(current)
                current = ""
                continue
            # A group is part of the sequence: its literals continue the run around it.
            current = _walk(sub, runs, current)
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)) and av[0] >= 1:
            runs.append(current)
            runs.append(_walk(av[2], runs, ""))
            current = ""
        elif op is _c.AT:
            continue  # anchors match no characters, so they do not break a run
        else:
            runs.append(current)
            current = ""
    return current
