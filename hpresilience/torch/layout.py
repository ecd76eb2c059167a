"""On-disk layout of one memory tier, its markers and retention (plain files; no torch here).

    <memory_dir>/<namespace>/step_0000000120/rank_3.bin    raw tensor bytes of rank 3
                                            rank_3.idx    JSON index: offsets, lengths, checksums
                                            .metadata     DCP metadata (pickled)
                                            COMMIT        written last: the step is complete everywhere
    <memory_dir>/<namespace>/peer/5/step_0000000120/...   the copy of rank 5's shard held for its node
    <memory_dir>/<namespace>/.spare/rank_3.bin            a pruned shard file kept for reuse

Every file appears under its final name by rename, so a reader never sees half a file. A spare keeps its
tmpfs pages: overwriting them is a plain memcpy, while fresh pages cost a page fault each.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpresilience.errors import ConfigError, HPResilienceError
from hpresilience.fileio import atomic_write
from hpresilience.log import get_logger
from hpresilience.torch.cleanup import JOB_FILE, cgroup_headroom, job_file_text
from hpresilience.torch.private import (
    TierSecurityError,
    ensure_private_dir,
    expand_root,
    open_trusted,
    read_trusted,
)

log = get_logger("hpresilience.torch")

COMMIT = "COMMIT"
METADATA = ".metadata"
_STEP_RE = re.compile(r"^step_(\d{10})$")

_xxhash: Any
try:  # xxh3 is ~10x faster than zlib's crc32; it is optional and the algorithm is recorded per file.
    import xxhash as _xxhash

    DEFAULT_ALGO = "xxh3_64"
except ImportError:  # pragma: no cover - depends on the environment
    _xxhash = None
    DEFAULT_ALGO = "crc32"


class ChecksumError(HPResilienceError):
    """Bytes read back do not match the checksum written with them."""


def hasher(algo: str) -> Callable[[Any], int]:
    if algo == "crc32":
        return zlib.crc32
    if algo == "xxh3_64":
        if _xxhash is None:
            raise ChecksumError("checkpoint was written with xxh3_64 checksums but the xxhash package is missing")
        fn: Callable[[Any], int] = _xxhash.xxh3_64_intdigest
        return fn
    raise ChecksumError(f"unknown checksum algorithm {algo!r}")


def step_name(step: int) -> str:
    return f"step_{step:010d}"


def parse_step(name: str) -> int | None:
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def shard_names(rank: int) -> tuple[str, str]:
    return f"rank_{rank}.bin", f"rank_{rank}.idx"


@dataclass(frozen=True)
class ItemLoc:
    """Where one item lives in a rank's shard file."""

    rank: int
    offset: int
    length: int
    checksum: int
    algo: str
    dtype: str | None = None  # None: a pickled (BYTE_IO) item
    shape: tuple[int, ...] | None = None


@dataclass
class ShardIndex:
    """The JSON index written beside a rank's shard file; `items` maps (fqn, offset) to a location."""

    rank: int
    step: int
    size: int
    items: dict[tuple[str, tuple[int, ...] | None], ItemLoc] = field(default_factory=dict)

    def to_json(self) -> bytes:
        rows = [
            {
                "fqn": k[0],
                "at": list(k[1]) if k[1] is not None else None,
                "offset": v.offset,
                "length": v.length,
                "checksum": v.checksum,
                "algo": v.algo,
                "dtype": v.dtype,
                "shape": list(v.shape) if v.shape is not None else None,
            }
            for k, v in self.items.items()
        ]
        return json.dumps({"rank": self.rank, "step": self.step, "size": self.size, "items": rows}).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> ShardIndex:
        try:
            doc = json.loads(raw)
            idx = cls(rank=int(doc["rank"]), step=int(doc["step"]), size=int(doc["size"]))
            for row in doc["items"]:
                key = (str(row["fqn"]), tuple(row["at"]) if row["at"] is not None else None)
                idx.items[key] = ItemLoc(
                    rank=idx.rank,
                    offset=int(row["offset"]),
                    length=int(row["length"]),
                    checksum=int(row["checksum"]),
                    algo=str(row["algo"]),
                    dtype=row["dtype"],
                    shape=tuple(row["shape"]) if row["shape"] is not None else None,
                )
        except (ValueError, KeyError, TypeError) as err:
            raise ChecksumError(f"{where}: unreadable shard index ({err})") from None
        return idx


def verify_shard(data_path: Path, idx: ShardIndex) -> None:
    """Re-hash every item of a shard file; raise ChecksumError naming the first bad one."""
    size = data_path.stat().st_size
    if size != idx.size:
        raise ChecksumError(f"{data_path}: {size} bytes, index says {idx.size}")
    with os.fdopen(open_trusted(data_path), "rb", buffering=0) as f:
        for key, loc in sorted(idx.items.items(), key=lambda kv: kv[1].offset):
            buf = bytearray(loc.length)
            f.seek(loc.offset)
            f.readinto(buf)
            if hasher(loc.algo)(buf) != loc.checksum:
                raise ChecksumError(f"{data_path}: checksum mismatch in item {key[0]} at byte {loc.offset}")


def _shard_ranks(d: Path) -> set[int]:
    out = set()
    for n in _listdir(d):
        m = re.match(r"^rank_(\d+)\.idx$", n)
        if m and (d / f"rank_{m.group(1)}.bin").is_file():
            out.add(int(m.group(1)))
    return out


def _note_world(worlds: dict[int, int], step: int, d: Path) -> None:
    try:
        worlds[step] = int(json.loads(read_trusted(d / COMMIT))["world_size"])
    except (OSError, ValueError, KeyError, TypeError, HPResilienceError):
        pass  # an unreadable marker tells nothing; the step may still come from another rank


def _read_small(p: Path) -> str | None:
    try:
        return read_trusted(p).decode(errors="replace").strip()
    except (OSError, HPResilienceError):
        return None


def _listdir(d: Path) -> list[str]:
    try:
        return os.listdir(d)
    except FileNotFoundError:
        return []


class MemoryTier:
    """One node's memory tier for one namespace."""

    def __init__(self, root: str | os.PathLike[str], namespace: str) -> None:
        self.root = Path(expand_root(str(root)))
        self.base = self.root / namespace
        # Where the job's memory limit is read (tests point these at a recorded cgroup tree).
        self.cgroup_paths = ("/proc/self/cgroup", "/sys/fs/cgroup")

    def ensure(self) -> None:
        """Make (or accept) the user's root and the namespace as folders only this user can change, and
        record the Slurm job writing it, so the epilog can remove it if the job crashes."""
        try:
            ensure_private_dir(self.root, tier_root=True)
            ensure_private_dir(self.base)
            job = job_file_text()
            if job is not None and _read_small(self.base / JOB_FILE) != job:
                atomic_write(self.base / JOB_FILE, job, make_parents=False)
        except TierSecurityError:
            raise
        except OSError as err:
            raise ConfigError(f"checkpoint memory tier {self.root}: cannot use it: {err}") from None

    def step_dir(self, step: int) -> Path:
        return self.base / step_name(step)

    def peer_dir(self, src_rank: int, step: int | None = None) -> Path:
        d = self.base / "peer" / str(src_rank)
        return d if step is None else d / step_name(step)

    def spare(self, rank: int) -> Path:
        return self.base / ".spare" / f"rank_{rank}.bin"

    @staticmethod
    def _steps(d: Path) -> list[int]:
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            return []
        return sorted(s for s in (parse_step(n) for n in names) if s is not None)

    def steps(self) -> list[int]:
        return self._steps(self.base)

    def peer_sources(self) -> list[int]:
        try:
            return sorted(int(n) for n in os.listdir(self.base / "peer") if n.isdigit())
        except FileNotFoundError:
            return []

    @staticmethod
    def has_shard(d: Path, rank: int) -> bool:
        return all((d / n).is_file() for n in shard_names(rank))

    @staticmethod
    def is_committed(d: Path) -> bool:
        return (d / COMMIT).is_file() and (d / METADATA).is_file()

    def inventory(self, rank: int) -> dict[str, Any]:
        """What this node can offer for a load: own shards, held peer shards, committed steps, the world
        size each committed step was saved with, and every saved rank's shard found on this node."""
        own = [s for s in self.steps() if self.has_shard(self.step_dir(s), rank)]
        committed = {s for s in self.steps() if self.is_committed(self.step_dir(s))}
        worlds: dict[int, int] = {}
        shards: dict[int, set[int]] = {}
        for s in self.steps():
            d = self.step_dir(s)
            shards.setdefault(s, set()).update(_shard_ranks(d))
            if s in committed:
                _note_world(worlds, s, d)
        held: dict[int, list[int]] = {}
        for src in self.peer_sources():
            d = self.peer_dir(src)
            held[src] = [s for s in self._steps(d) if self.has_shard(d / step_name(s), src)]
            for s in held[src]:
                shards.setdefault(s, set()).add(src)
            for s in self._steps(d):
                if self.is_committed(d / step_name(s)):
                    committed.add(s)
                    _note_world(worlds, s, d / step_name(s))
        return {
            "own": own,
            "held": held,
            "committed": sorted(committed),
            "worlds": worlds,
            "shards": {s: sorted(r) for s, r in shards.items() if r},
        }

    def find_shard(self, step: int, rank: int) -> Path | None:
        """The folder on this node holding saved rank `rank`'s shard of `step` (own tier or a peer copy)."""
        for d in (self.step_dir(step), self.peer_dir(rank, step)):
            if self.has_shard(d, rank):
                return d
        return None

    def write_commit(self, d: Path, step: int, world_size: int, save_id: str) -> None:
        atomic_write(
            d / COMMIT,
            json.dumps({"step": step, "world_size": world_size, "save_id": save_id, "time": time.time()}),
            make_parents=False,
        )

    def prune(
        self,
        rank: int,
        committed_step: int,
        keep: int,
        pinned: Iterable[int] = (),
        peer_src: int | None = None,
    ) -> list[int]:
        """Drop this rank's steps older than the `keep` newest committed ones, once `committed_step` is.

        Ranks of one node share the tier: each removes only its own files (and the peer copies it holds);
        the step folder goes when no rank's shard is left in it. Steps newer than `committed_step` may
        still be in flight and are never touched.
        """
        pinned = set(pinned)
        steps = self.steps()
        kept = [s for s in steps if s <= committed_step and self.is_committed(self.step_dir(s))][-keep:]
        if committed_step not in kept:
            return []
        # Saves run one at a time, so an uncommitted step older than a committed one is a dead partial.
        gone = [s for s in steps if s not in pinned and (s < kept[0] or (s < committed_step and s not in kept))]
        for s in gone:
            d = self.step_dir(s)
            data, idx = (d / n for n in shard_names(rank))
            idx.unlink(missing_ok=True)
            # A save killed mid-write leaves `rank_R.bin.tmp`: often a whole shard (a recycled spare).
            partial = d / f"{data.name}.tmp"
            for f in (data, partial):
                self.recycle(f, rank)
                f.unlink(missing_ok=True)
            if not any(n.startswith("rank_") for n in _listdir(d)):
                shutil.rmtree(d, ignore_errors=True)
        if peer_src is not None:
            d = self.peer_dir(peer_src)
            psteps = self._steps(d)
            pkept = [s for s in psteps if self.is_committed(d / step_name(s))][-keep:]
            for s in psteps:
                if pkept and s < pkept[0]:
                    shutil.rmtree(d / step_name(s), ignore_errors=True)
        if gone:
            log.info("checkpoint_steps_pruned", rank=rank, steps=gone, kept=kept)
        return gone

    def recycle(self, data: Path, rank: int) -> None:
        spare = self.spare(rank)
        if data.is_file() and not spare.exists():
            spare.parent.mkdir(parents=True, exist_ok=True)
            os.replace(data, spare)

    def remove(self) -> int:
        """Remove this namespace's folder (own shards, peer copies, spares); the bytes it held."""
        held = self.used_bytes()
        # rmtree works on open descriptors here (shutil.rmtree.avoids_symlink_attacks): a link planted
        # inside the folder is removed, never followed.
        shutil.rmtree(self.base, ignore_errors=True)
        return held

    def used_bytes(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.base):
            for f in files:
                try:
                    total += os.stat(os.path.join(dirpath, f)).st_blocks * 512
                except FileNotFoundError:
                    pass
        return total

    def check_capacity(self, shard_bytes: int, keep: int, local_ranks: int, replicas: int) -> None:
        """Fail with a clear message when the tier cannot hold what the settings imply."""
        self.ensure()
        try:
            st = os.statvfs(self.base)
        except OSError as err:
            raise ConfigError(f"checkpoint memory tier {self.root}: cannot use it: {err}") from None
        if not os.access(self.base, os.W_OK):
            raise ConfigError(f"checkpoint memory tier {self.base}: not writable")
        used = self.used_bytes()
        available = st.f_bavail * st.f_frsize + used
        need = (keep + 1) * shard_bytes * local_ranks * (1 + replicas)
        gib = 1 << 30
        # tmpfs pages are charged to the job's memory cgroup: a tier that fits /dev/shm may still get the
        # job OOM-killed. The staging copy (one shard per rank) counts there too.
        head = cgroup_headroom(*self.cgroup_paths)
        ram = need - used + shard_bytes * local_ranks
        if head is not None and ram > head.free:
            raise ConfigError(
                f"checkpoint memory tier {self.root}: the job's memory limit leaves {head.free / gib:.2f} GiB "
                f"({head.cgroup}: limit {head.limit / gib:.2f} GiB, in use {head.usage / gib:.2f} GiB), the "
                f"settings need {ram / gib:.2f} GiB more on this node = (keep {keep} + 1 in flight) x "
                f"{shard_bytes / gib:.2f} GiB per rank x {local_ranks} rank(s) x {1 + replicas} "
                f"(own{' + peer copy' if replicas else ''}) + a staging copy per rank, less "
                f"{used / gib:.2f} GiB already in the tier. Ask Slurm for more memory (--mem) or lower `keep`."
            )
        if need > available:
            raise ConfigError(
                f"checkpoint memory tier {self.root} is too small: it has {available / gib:.2f} GiB for "
                "this job, "
                f"the settings need {need / gib:.2f} GiB = (keep {keep} + 1 in flight) x "
                f"{shard_bytes / gib:.2f} GiB per rank x {local_ranks} rank(s) on this node x "
                f"{1 + replicas} (own{' + peer copy' if replicas else ''}). Enlarge it "
                f"(mount -o remount,size=... /dev/shm, or docker --shm-size) or lower `keep`."
            )
