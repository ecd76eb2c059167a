"""Shared pieces of the fuzz tests (issue 14): example budget, outcome tally, and input strategies.

Every fuzz target feeds generated input to a loader or parser and sorts what happened into:
accepted, a clear error (the package's own HPResilienceError), or skipped (a parser dropped and logged
an odd record). Anything else propagates and fails the test: that is a crash.

Budget: a few hundred examples per target by default (a few seconds each, as CI runs them);
`pytest --long` or HPRESILIENCE_FUZZ_LONG=1 runs 100,000 per target (HPRESILIENCE_FUZZ_EXAMPLES=N
overrides both). The tally is printed at the end of the session.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

LONG_EXAMPLES = 100_000
SHORT_EXAMPLES = 150

TALLY: dict[str, Counter[str]] = {}
_long = [os.environ.get("HPRESILIENCE_FUZZ_LONG", "") not in ("", "0")]


def set_long(on: bool) -> None:
    _long[0] = _long[0] or on


def examples() -> int:
    if os.environ.get("HPRESILIENCE_FUZZ_EXAMPLES"):
        return int(os.environ["HPRESILIENCE_FUZZ_EXAMPLES"])
    return LONG_EXAMPLES if _long[0] else SHORT_EXAMPLES


def fuzz_settings() -> settings:
    """Read at test-definition time: conftest sets the mode before the test modules are imported."""
    return settings(
        max_examples=examples(),
        deadline=None,
        database=None,
        derandomize=not _long[0],
        suppress_health_check=list(HealthCheck),
    )


def scratch_dir() -> Path:
    """A private directory (0700) for the input files, removed at exit: one file rewritten per input, as
    creating a directory per input would cost more than the loader under test."""
    d = Path(tempfile.mkdtemp(prefix="hpr-fuzz-"))
    atexit.register(shutil.rmtree, d, True)
    return d


def count(target: str, outcome: str, n: int = 1) -> None:
    TALLY.setdefault(target, Counter())[outcome] += n


# --- values -----------------------------------------------------------------------------------------------

HOSTILE_FLOATS = st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -0.0, 9.3e9, 5e-324, 1e10])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-10, max_value=10**5),
    st.floats(allow_nan=True, allow_infinity=True),
    HOSTILE_FLOATS,
    st.text(max_size=40),
    st.sampled_from(["", "-", "1", "1.5", "²", "yes", "\x00", "9" * 5000, "gpu-[1-"]),
)


def json_like(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    return st.recursive(
        SCALARS,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
        max_leaves=max_leaves,
    )


def mutate_bytes(data: bytes, draw: Any) -> bytes:
    """One byte-level accident to a serialized document: truncation, a foreign byte, a duplicated line."""
    kind = draw(st.sampled_from(["none", "none", "truncate", "insert", "dupline", "bom16", "deep"]))
    if kind == "truncate" and data:
        cut: int = draw(st.integers(0, len(data)))
        return data[:cut]
    if kind == "insert":
        at: int = draw(st.integers(0, len(data)))
        foreign: bytes = draw(st.binary(min_size=1, max_size=8))
        return data[:at] + foreign + data[at:]
    if kind == "dupline" and b"\n" in data:
        lines = data.split(b"\n")
        i = draw(st.integers(0, len(lines) - 1))
        return b"\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])
    if kind == "bom16":
        return data.decode("utf-8", "replace").encode("utf-16")
    if kind == "deep":
        # Deeper cases live in tests/test_fileio.py: PyYAML's scanner looks up to 1024 characters ahead
        # on each level there, which costs about a second per file (bounded, but too slow to repeat 100,000 times).
        depth: int = draw(st.sampled_from([10, 63, 65, 100]))
        return data + b"\nzz: " + b"[" * depth + b"]" * depth + b"\n"
    return data
