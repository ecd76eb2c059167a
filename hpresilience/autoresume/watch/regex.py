"""Log-rule patterns on RE2: matching time linear in the line, whatever the pattern (issue 14).

Python's `re` backtracks: `(a+)+$` takes seconds on 26 characters and days on 40, and it holds the GIL
meanwhile, so one such rule would freeze the wrapper's output forwarding, Slurm polling and signal
handling. RE2 decides every match in time linear in the text, and refuses at compile time what it cannot
do that way (backreferences, lookaround); such a rule is a ConfigError naming the rule.

Semantics otherwise follow Python's `re.match` (anchored at the line's start); differences a rule author
may meet: `\\d`, `\\w`, `\\s` and `\\b` are ASCII-only, `\\Z` is spelt `\\z`, and `(?x)`/`(?#...)` are not
available. docs/auto-resume-rules.md lists them.

The low-level binding (`re2._re2.RE2.Match`) is called directly: the module's `re`-compatible layer costs
several microseconds per call in Python, which a chatty job pays on every line.
"""

from __future__ import annotations

from typing import Any

import re2
from re2 import _re2

_ANCHOR_START = _re2.RE2.Anchor.ANCHOR_START


def _options(capture: bool) -> Any:
    o = re2.Options()
    o.log_errors = False  # the error becomes our one-line ConfigError, not a line on stderr from absl
    o.never_capture = not capture
    return o


class RuleMatch:
    """The part of `re.Match` the rule engine uses: `group(i)`."""

    __slots__ = ("_data", "_spans")

    def __init__(self, data: bytes, spans: list[tuple[int, int]]) -> None:
        self._data = data
        self._spans = spans

    def group(self, index: int = 0) -> str | None:
        if index >= len(self._spans):
            raise IndexError("no such group")
        start, end = self._spans[index]
        return None if start < 0 else self._data[start:end].decode("utf-8", "replace")


class RulePattern:
    """One compiled rule pattern. `match(line)` is `re.match` on RE2; `groups` counts capture groups.

    With `capture=False` the pattern only decides whether a line matches (RE2's DFA, the fastest path);
    `group(0)` is then the whole match and no other group exists.
    """

    __slots__ = ("_re", "groups", "pattern")

    def __init__(self, pattern: str, capture: bool = True) -> None:
        compiled = _re2.RE2(pattern.encode("utf-8", "surrogatepass"), _options(capture))
        if not compiled.ok():
            err = compiled.error()
            raise ValueError(err.decode("utf-8", "replace") if isinstance(err, bytes) else str(err))
        self._re = compiled
        self.pattern = pattern
        self.groups: int = compiled.NumberOfCapturingGroups() if capture else 0

    def match(self, line: str) -> RuleMatch | None:
        data = line.encode("utf-8", "surrogatepass")
        spans = self._re.Match(_ANCHOR_START, data, 0, len(data))
        if spans[0][0] < 0:
            return None
        return RuleMatch(data, spans)


def compile_rule_pattern(rule: str, key: str, pattern: str, capture: bool = True) -> RulePattern:
    """Compile or raise ValueError `rule 'R': KEY ...` saying why RE2 refuses it (pydantic reports it)."""
    try:
        return RulePattern(pattern, capture)
    except (ValueError, TypeError, UnicodeError) as err:
        hint = ""
        text = str(err)
        if "perl operator" in text or "escape sequence" in text:
            hint = (
                " (rules run on RE2, which has no backreferences, lookaround, \\Z or (?x); "
                "see docs/auto-resume-rules.md)"
            )
        raise ValueError(f"rule {rule!r}: {key} is not a valid regular expression: {text}{hint}") from None
