"""Slurm hostlist expressions (`n[1-3,7]`), through python-hostlist.

Pure functions; a malformed expression raises SlurmParseError naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from types import ModuleType

from hpresilience.errors import SlurmParseError

# Only a trailing number may be bracketed: Slurm 22.05 to 23.02.4 reject a range before other text
# (`node[1-2]-ib`, "Invalid hostlist"), which python-hostlist would otherwise produce.
_TRAILING_NUMBER = re.compile(r"^(?P<prefix>.*?)(?P<number>\d+)$")


def _lib() -> ModuleType:
    """python-hostlist, imported on first use: it is in the `node` extra, and a training environment
    (`hpresilience[torch]`) imports the Slurm client for `hpresilience job` without ever expanding a list."""
    import hostlist

    lib: ModuleType = hostlist
    return lib


def expand(expr: str | None) -> list[str]:
    """`n[1-3]` -> [n1, n2, n3]; empty, None and Slurm's `(null)` give []. Spaces around names are dropped,
    as scontrol drops them."""
    if not expr or expr.strip() in ("", "(null)", "None"):
        return []
    _hostlist = _lib()
    try:
        names = [name.strip() for name in _hostlist.expand_hostlist(expr.strip())]
    except _hostlist.BadHostlist as err:
        raise SlurmParseError(["hostlist", expr], None, "", f"bad hostlist expression {expr!r}: {err}") from None
    return [n for n in names if n]


def compress(names: Iterable[str]) -> str:
    """[n1, n2, n3] -> `n[1-3]`, in a form every Slurm release accepts: only trailing numbers are ranged,
    names are grouped by their text before that number, and other names are listed as they are."""
    items = [str(n).strip() for n in names]
    if not items:
        return ""
    for name in items:
        if not name or any(c in name for c in ",[] \t\n"):
            raise SlurmParseError(["hostlist", name], None, "", f"bad node name {name!r} in a hostlist")
    groups: dict[str, list[str]] = {}
    plain: list[str] = []
    for name in items:
        m = _TRAILING_NUMBER.match(name)
        if m is None:
            plain.append(name)
        else:
            groups.setdefault(m["prefix"], []).append(m["number"])
    parts = []
    _hostlist = _lib()
    for prefix, numbers in sorted(groups.items()):
        try:
            ranged = str(_hostlist.collect_hostlist([f"x{n}" for n in numbers]))[1:]
        except _hostlist.BadHostlist as err:
            raise SlurmParseError(["hostlist", prefix], None, "", f"cannot compress {numbers!r}: {err}") from None
        parts.append(prefix + ranged)
    return ",".join(parts + sorted(set(plain)))
