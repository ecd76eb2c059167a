"""The durable tier behind the memory tier: S3 (s3tier.py) or a shared filesystem (here).

Both keep one layout and one commit rule, so the same upload, restore, elastic and fallback paths serve
either:

    <base>/<namespace>/step_0000000120/rank_3.bin, rank_3.idx, .metadata
    <base>/<namespace>/_committed/step_0000000120        the marker, written last; one listing finds all

Filesystem tier (Lustre, GPFS, NFS, FSx): every file is written beside its final name (O_EXCL, mode
0600, no link followed), fsynced, renamed into place, and its folder fsynced; the marker goes last,
after every rank's shard and the metadata. A crash at any point leaves either no marker (the step is
never loaded) or a complete step. Retention removes the marker first. Files read back must be regular
files of this user that nobody else may change, as in the memory tier.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hpresilience.errors import ConfigError, ExternalError, HPResilienceError
from hpresilience.torch.layout import COMMIT, METADATA, parse_step, shard_names, step_name
from hpresilience.torch.private import ensure_private_dir, expand_root, open_private, open_trusted, read_trusted

if TYPE_CHECKING:
    from hpresilience.torch.settings import CheckpointConfig

MARKERS = "_committed"


class DurableTier(Protocol):
    """What the checkpointer needs of a durable tier (S3 or a shared filesystem)."""

    kind: str

    def marker(self, step: int) -> str: ...

    def upload_shard(self, step_dir: Path, step: int, rank: int) -> None: ...

    def commit(self, step_dir: Path, step: int) -> None: ...

    def committed_steps(self) -> list[int]: ...

    def world_of(self, step: int) -> int | None: ...

    def download_shard(self, step: int, rank: int, dest_dir: Path) -> None: ...

    def download_metadata(self, step: int, dest_dir: Path) -> None: ...

    def prune(self, keep: int) -> list[int]: ...


def durable_tier(cfg: CheckpointConfig, s3_client: Any = None) -> DurableTier | None:
    """The configured durable tier, or None. boto3 is imported only when S3 is configured."""
    if cfg.s3_base:
        from hpresilience.torch.s3tier import S3Tier

        return S3Tier(cfg, s3_client)
    if cfg.fs_base:
        return FsTier(cfg)
    return None


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_file(src: Path, dst: Path, *, fsync: bool) -> None:
    """Copy a trusted file beside `dst`, (fsync,) rename into place (, fsync the folder).

    Not fileio.atomic_write: the shard is streamed file to file (sendfile), never held in a buffer.
    """
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    fd_in = open_trusted(src)
    try:
        fd_out = open_private(tmp, os.O_WRONLY)
        try:
            size, off = os.fstat(fd_in).st_size, 0
            while off < size:
                n = os.sendfile(fd_out, fd_in, off, min(size - off, 1 << 30))
                if n == 0:
                    raise ExternalError(f"{src}: shorter than expected while copying to {dst}")
                off += n
            if fsync:
                os.fsync(fd_out)
        finally:
            os.close(fd_out)
        os.replace(tmp, dst)
        if fsync:
            _fsync_dir(dst.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd_in)


class FsTier:
    kind = "filesystem"

    def __init__(self, cfg: CheckpointConfig) -> None:
        assert cfg.fs_base is not None
        self.root = Path(expand_root(cfg.fs_base))
        self.base = self.root / cfg.namespace

    def _guard(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except HPResilienceError:
            raise
        except OSError as err:
            raise ExternalError(f"filesystem tier {what} failed ({self.base}): {err}") from None

    def _dir(self, d: Path) -> Path:
        if not self.root.is_dir():
            raise ConfigError(f"checkpoint fs_base {self.root} is not a folder (is the filesystem mounted?)")
        for p in (self.base, *((d,) if d != self.base else ())):
            ensure_private_dir(p)
        return d

    def step_dir(self, step: int) -> Path:
        return self.base / step_name(step)

    def marker(self, step: int) -> str:
        return str(self.base / MARKERS / step_name(step))

    def upload_shard(self, step_dir: Path, step: int, rank: int) -> None:
        def run() -> None:
            d = self._dir(self.step_dir(step))
            for name in shard_names(rank):  # the index after the data, as in every tier
                copy_file(step_dir / name, d / name, fsync=True)

        self._guard("write", run)

    def commit(self, step_dir: Path, step: int) -> None:
        """Coordinator only, after every rank's shard is in place: metadata, then the marker."""

        def run() -> None:
            copy_file(step_dir / METADATA, self._dir(self.step_dir(step)) / METADATA, fsync=True)
            copy_file(step_dir / COMMIT, self._dir(self.base / MARKERS) / step_name(step), fsync=True)

        self._guard("commit", run)

    def committed_steps(self) -> list[int]:
        try:
            names = os.listdir(self.base / MARKERS)
        except FileNotFoundError:
            return []
        except OSError as err:
            raise ExternalError(f"filesystem tier list failed ({self.base}): {err}") from None
        return sorted(s for s in (parse_step(n) for n in names) if s is not None)

    def world_of(self, step: int) -> int | None:
        try:
            return int(json.loads(read_trusted(Path(self.marker(step))))["world_size"])
        except (OSError, HPResilienceError, ValueError, KeyError, TypeError):
            return None

    def download_shard(self, step: int, rank: int, dest_dir: Path) -> None:
        def run() -> None:
            dest_dir.mkdir(parents=True, exist_ok=True)
            for name in shard_names(rank):
                copy_file(self.step_dir(step) / name, dest_dir / name, fsync=False)

        self._guard("read", run)

    def download_metadata(self, step: int, dest_dir: Path) -> None:
        def run() -> None:
            copy_file(self.step_dir(step) / METADATA, dest_dir / METADATA, fsync=False)
            copy_file(Path(self.marker(step)), dest_dir / COMMIT, fsync=False)

        self._guard("read", run)

    def prune(self, keep: int) -> list[int]:
        """Remove the oldest committed steps beyond `keep`; the marker goes first so no reader trusts them."""
        steps = self.committed_steps()
        gone = steps[:-keep] if keep and len(steps) > keep else []
        for s in gone:
            self._guard("delete", os.unlink, self.marker(s))
            self._guard("delete", _fsync_dir, self.base / MARKERS)
            shutil.rmtree(self.step_dir(s), ignore_errors=True)
        return gone
