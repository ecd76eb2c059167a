"""Slurm hostlist expressions (`n[1-3,7]`), through python-hostlist.

Pure functions; a malformed expression raises SlurmParseError naming it.
"""

from __future__ import annotations

from collections.abc import Iterable

import hostlist as _hostlist

from hpresilience.errors import SlurmParseError


def expand(expr: str | None) -> list[str]:
    """`n[1-3]` -> [n1, n2, n3]; empty, None and Slurm's `(null)` give []."""
    if not expr or expr.strip() in ("", "(null)", "None"):
        return []
    try:
        return list(_hostlist.expand_hostlist(expr.strip()))
    except _hostlist.BadHostlist as err:
        raise SlurmParseError(["hostlist", expr], None, "", f"bad hostlist expression {expr!r}: {err}") from None


def compress(names: Iterable[str]) -> str:
    """[n1, n2, n3] -> `n[1-3]`, keeping Slurm's sorted form."""
    items = list(names)
    return str(_hostlist.collect_hostlist(items)) if items else ""
