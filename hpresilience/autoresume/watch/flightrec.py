"""PyTorch flight-recorder dumps in a hang's or a collective failure's evidence: which ranks are behind.

Where the backend has one, the step runs with PyTorch's flight recorder on (launch/stepops.py sets
TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE unless the user did, and points
TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE into the attempt's private evidence directory, so
NCCL's dump on timeout lands there; TORCH_NCCL_DUMP_ON_TIMEOUT=1). gloo in torch 2.13 records but never
dumps by itself: hpresilience.torch's heartbeat dumps on the wrapper's request (`fr-request` in the evidence
directory) into `fr-rank<R>-<pid>.pkl`.

A dump is a pickle: it is read with an unpickler that builds only builtin containers and scalars (any global,
hence any code, is refused), at most MAX_DUMP_BYTES each. NVRx-style analysis: records are grouped by process
group; each rank's last collective sequence number in a group is how far it got; the wavefront is the highest,
and the ranks of that group below it (or with no dump at all) are behind: they did not enter the collective
the others wait in.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpresilience.log import get_logger

log = get_logger("hpresilience.autoresume")
MAX_DUMP_BYTES = 32 * 1024 * 1024
MAX_DUMPS = 4096
# Our heartbeat's dumps, and torch's own (TORCH_*_TEMP_FILE prefix + rank).
DUMP_NAME = re.compile(r"^fr-(?:rank(\d{1,7})-\d{1,10}\.pkl|dump-rank(\d{1,7}))$")
DUMP_PREFIX = "fr-dump-rank"
REQUEST = "fr-request"


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight-recorder dump may not name {module}.{name}")


def safe_load(data: bytes) -> Any:
    """Unpickle builtin containers and scalars only; anything else raises pickle.UnpicklingError."""
    return _Restricted(io.BytesIO(data)).load()


def read_dumps(directory: Path) -> dict[int, dict[str, Any]]:
    """Every readable dump in `directory`, by rank (a later dump of a rank wins); bad ones are logged and skipped."""
    out: dict[int, dict[str, Any]] = {}
    try:
        names = sorted(os.listdir(directory))[:MAX_DUMPS]
    except OSError:
        return out
    for name in names:
        m = DUMP_NAME.match(name)
        if not m:
            continue
        rank = int(m.group(1) or m.group(2))
        try:
            fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_DUMP_BYTES + 1)
            if len(data) > MAX_DUMP_BYTES:
                raise ValueError(f"over {MAX_DUMP_BYTES} bytes")
            dump = safe_load(data)
            if not isinstance(dump, dict):
                raise ValueError(f"a {type(dump).__name__}, not a mapping")
        except (OSError, ValueError, EOFError, pickle.UnpicklingError, RecursionError, MemoryError) as err:
            log.warning("flight_recorder_dump_skipped", file=name, error=str(err)[:200])
            continue
        out[rank] = dump
    return out


@dataclass(frozen=True)
class Lag:
    rank: int
    group: str
    seq: int | None  # its last collective in the group (None: no dump, or no record of the group)
    wavefront: int
    collective: str  # what the ranks at the wavefront wait in


@dataclass
class Wavefront:
    behind: list[Lag] = field(default_factory=list)
    groups: dict[str, int] = field(default_factory=dict)  # group -> its wavefront sequence number
    dumps: int = 0

    @property
    def ranks(self) -> list[int]:
        return sorted({lag.rank for lag in self.behind})


def _last_seqs(dump: Mapping[str, Any]) -> dict[str, tuple[int, str]]:
    """Per process group of one rank's dump: its highest collective sequence number, and that record's name."""
    out: dict[str, tuple[int, str]] = {}
    entries = dump.get("entries")
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg, seq = e.get("process_group"), e.get("collective_seq_id")
        key = str(pg[0]) if isinstance(pg, (tuple, list)) and pg else str(e.get("pg_id", "?"))
        if isinstance(seq, int) and not isinstance(seq, bool) and seq > out.get(key, (-1, ""))[0]:
            out[key] = (seq, str(e.get("profiling_name", "?"))[:64])
    return out


def wavefront(dumps: Mapping[int, Mapping[str, Any]], world: Sequence[int] = ()) -> Wavefront:
    """The ranks behind in each process group. `world`: every rank of the job; for the default group ("0"), one
    of them without a dump (stopped, dead, or gloo's rank that could not answer) is behind too."""
    per_rank = {rank: _last_seqs(d) for rank, d in dumps.items()}
    groups: dict[str, dict[int, tuple[int, str]]] = {}
    for rank, seqs in per_rank.items():
        for pg, last in seqs.items():
            groups.setdefault(pg, {})[rank] = last
    out = Wavefront(dumps=len(dumps))
    for pg, ranks in sorted(groups.items()):
        front, name = max(ranks.values())
        out.groups[pg] = front
        for rank, (seq, _) in sorted(ranks.items()):
            if seq < front:
                out.behind.append(Lag(rank, pg, seq, front, name))
        if pg == "0":
            out.behind += [Lag(r, pg, None, front, name) for r in world if r not in dumps]
    return out
