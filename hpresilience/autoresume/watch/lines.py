"""A step's output as lines: raw chunks into blocks of whole lines (`LineBuffer`), and the lines of a block a rule's
pattern matches (`matching_lines`, `first_matching_line`) without splitting the block when a literal can find them.

Patterns are applied as `re.match` is, to each line without its terminator (rules.py says why): a line is cut
out of the block and matched alone, so `^` and `$` mean the line's start and end.
"""

from __future__ import annotations

import re

from hpresilience.autoresume.watch.regex import RuleMatch, RulePattern


def _line_at(text: str, i: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, i) + 1
    end = text.find("\n", i)
    return start, (len(text) if end < 0 else end)


def matching_lines(text: str, pattern: RulePattern, literal: str, first_only: bool) -> list[tuple[str, RuleMatch]]:
    """(line, match) for every line of `text` the pattern matches, in order; only the first if asked."""
    found: list[tuple[str, RuleMatch]] = []
    match = pattern.match
    if literal:
        find = text.find
        pos = find(literal)
        while pos >= 0:
            s, e = _line_at(text, pos)
            line = text[s:e]
            m = match(line)
            if m is not None:
                found.append((line, m))
                if first_only:
                    break
            pos = find(literal, e + 1)
        return found
    lines = text.split("\n")
    if lines and lines[-1] == "" and text.endswith("\n"):
        lines.pop()
    for line in lines:
        m = match(line)
        if m is not None:
            found.append((line, m))
            if first_only:
                break
    return found


def first_matching_line(text: str, pattern: RulePattern, literal: str) -> tuple[int, int] | None:
    """The span of the first line of `text` that `pattern` matches (the line, not the match)."""
    if literal:
        pos = text.find(literal)
        while pos >= 0:
            s, e = _line_at(text, pos)
            # Sliced, not match(text, s, e): "^" must match at the line's start as it does for a line alone.
            if pattern.match(text[s:e]) is not None:
                return s, e
            pos = text.find(literal, e + 1)
        return None
    s = 0
    n = len(text)
    while s < n or (s == 0 and n == 0):
        e = text.find("\n", s)
        e = n if e < 0 else e
        if pattern.match(text[s:e]) is not None:
            return s, e
        s = e + 1
    return None


class LineBuffer:
    """Turns raw output chunks into blocks of whole, decoded, length-capped lines for `RuleSet.feed_text`.

    Hostile output never hurts: invalid UTF-8 is replaced, "\\r" (progress bars) ends a line as in
    HyperPod's universal-newline reading, and a line longer than `max_line_bytes` is cut (its rest is
    dropped up to the next newline) so a single huge line costs bounded memory and regex time.
    """

    def __init__(self, max_line_bytes: int = 65536) -> None:
        self._max = max_line_bytes
        self._tail = b""
        self._overflow = False
        self._long_line = re.compile(rb"[^\n]{%d}" % (max_line_bytes + 1))

    def push(self, data: bytes) -> str:
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._overflow:
            nl = data.find(b"\n")
            if nl < 0:
                return ""
            self._overflow = False
            data = data[nl:]
        buf = self._tail + data if self._tail else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._keep_tail(buf)
            return ""
        block, rest = buf[: cut + 1], buf[cut + 1 :]
        self._keep_tail(rest)
        if len(block) > self._max and self._long_line.search(block) is not None:
            block = b"\n".join(line[: self._max] for line in block.split(b"\n"))
        return block.decode("utf-8", "replace")

    def flush(self) -> str:
        """The last line when the output ended without a newline."""
        tail, self._tail, self._overflow = self._tail, b"", False
        return tail.decode("utf-8", "replace") + "\n" if tail else ""

    def _keep_tail(self, rest: bytes) -> None:
        if len(rest) > self._max:
            rest = rest[: self._max]
            self._overflow = True
        self._tail = rest
