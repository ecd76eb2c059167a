"""Small file helpers every part shares: atomic writes, and YAML reads whose errors name file and place."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from hpresilience.errors import ConfigError
from hpresilience.log import get_logger

log = get_logger("hpresilience")


def atomic_write(
    path: Path | str, data: bytes | str, *, mode: int | None = None, fsync: bool = False, make_parents: bool = True
) -> None:
    """Write a whole file so that readers see the old file or the new one, never half of it: the one atomic
    write of the package (every state file, marker, metrics file and checkpoint index goes through it).

    The data goes to a temporary file in the same directory (so the rename cannot cross file systems), made
    with O_EXCL and mode 0600 (it never follows a planted link nor adopts another user's file), then is
    renamed over `path`; on any failure the temporary file is removed. `mode` sets the file's permissions
    before the rename (0600 when not given). With `fsync` the data is on disk before the rename: state that
    must survive a crash of the machine, not only of the process. `make_parents=False` for callers whose
    directories carry permissions of their own (the checkpoint tiers): a missing one is an error, not made.
    """
    p = Path(path)
    if make_parents:
        p.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_text(path: Path | str, text: str, fsync: bool = False, mode: int | None = None) -> None:
    """`atomic_write` for text (UTF-8)."""
    atomic_write(path, text, mode=mode, fsync=fsync)


def read_json_state(path: Path | str, event: str, **context: Any) -> dict[str, Any] | None:
    """A JSON object a part keeps as its state; None when the file is absent, and None with the warning `event`
    (the path, the error and `context`) when it cannot be read, is not JSON or is not an object. Corrupt state
    starts afresh and says so; it never stops a daemon. (`or {}`: the empty state.)"""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning(event, path=str(p), error=str(err)[:200], **context)
        return None
    if not isinstance(data, dict):
        log.warning(event, path=str(p), error=f"not a JSON object but {type(data).__name__}", **context)
        return None
    return data


@contextmanager
def locked(path: Path | str, wait_s: float) -> Iterator[bool]:
    """Hold an exclusive lock on `path` (created 0600 if absent) for the block; yields False when another
    process held it for all of `wait_s` seconds (the block then runs unlocked: the caller decides to skip).

    Two processes that read-modify-write the same state (the agent daemon and Slurm's HealthCheckProgram)
    take the same lock around the whole cycle. The file is opened without following a link and must belong
    to us: a lock file someone else planted in a shared directory is refused (OSError), not used."""
    p = Path(path)
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(f"{p} is not a regular file of this user: refused as a lock")
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    got = False
                    break
                time.sleep(0.05)
        try:
            yield got
        finally:
            if got:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def require_writable_dir(path: Path | str, what: str) -> None:
    """Make sure a daemon can keep its state in `path` (made if missing): write, then remove, a probe file.

    A daemon calls this once at start, so that a directory its systemd unit leaves read-only (ProtectSystem=
    strict without the path among its StateDirectory=/ReadWritePaths=) stops it with one line naming the
    setting, instead of a warning per cycle and state that is silently lost. ConfigError: exit 2, which the
    units do not restart (no crash loop)."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".hpr-write-probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(
            f"cannot write {what} {p} ({err.strerror or err}): set it to a writable directory, or "
            "under systemd list it in the unit's StateDirectory= or ReadWritePaths="
        ) from None


# Limits on what a YAML file may hold. Configuration, rules and profiles are a few KiB; these are far above
# any real file and far below what would hurt a daemon or `config show` (issue 14: an alias bomb of 514
# bytes expanded past 3.8 GB; a nesting 500 deep overflowed the stack).
MAX_YAML_BYTES = 4 * 1024 * 1024
MAX_YAML_DEPTH = 64
MAX_YAML_VALUES = 100_000

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _YamlRefused(Exception):
    """Raised inside the loader; read_yaml turns it into a ConfigError naming the file."""

    def __init__(self, message: str, node: yaml.Node | None = None) -> None:
        super().__init__(message)
        self.mark = node.start_mark if node is not None else None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and nesting deeper than MAX_YAML_DEPTH.

    The pure-Python composer is used on purpose: its recursion is ours to bound, libyaml's is not.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _YamlRefused(f"nested deeper than {MAX_YAML_DEPTH} levels", None)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            try:
                fresh = key not in seen
            except TypeError:  # an unhashable key: SafeLoader reports it itself below
                continue
            if not fresh:
                # Last-wins would silently drop the first value; which one was meant is the author's call.
                raise _YamlRefused(f"duplicate key {key!r}", key_node)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(data: Any) -> int:
    """How many values `data` holds once aliases are expanded (what a dump would write).

    Shared sub-trees (YAML aliases) are counted once per reference, in time linear in the distinct
    values; a cycle (`&a [*a]`) is refused, as no consumer could ever print or validate it.
    """
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()

    def size(obj: Any) -> int:
        if not isinstance(obj, (dict, list)):
            return 1
        key = id(obj)
        if key in sizes:
            return sizes[key]
        if key in open_ids:
            raise _YamlRefused("an alias refers to a value that contains it (a cycle)")
        open_ids.add(key)
        children = list(obj.items()) if isinstance(obj, dict) else obj
        total = 1
        for child in children:
            total += sum(size(c) for c in child) if isinstance(obj, dict) else size(child)
            if total > MAX_YAML_VALUES:
                break
        open_ids.discard(key)
        sizes[key] = total
        return total

    return size(data)


def _read_capped(p: Path, what: str) -> bytes:
    """The file's bytes; only a regular file, at most MAX_YAML_BYTES (a FIFO or /dev/zero never hangs us)."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not block; the S_ISREG test then refuses it.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise ConfigError(f"{p}: cannot read {what}: {err.strerror or err}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{p}: cannot read {what}: not a regular file")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_YAML_BYTES:
                raise ConfigError(f"{p}: cannot read {what}: larger than {MAX_YAML_BYTES // (1024 * 1024)} MiB")
        return b"".join(chunks)
    except OSError as err:
        raise ConfigError(f"{p}: cannot read {what}: {err.strerror or err}") from None
    finally:
        os.close(fd)


def _decode(p: Path, raw: bytes, what: str) -> str:
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(f"{p}: {what} is UTF-16; save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError(f"{p}: {what} is not UTF-8 text (byte 0x{raw[err.start]:02x} at line {line})") from None


def read_yaml(path: Path | str, what: str = "file") -> Any:
    """Parse a YAML file; every failure is one ConfigError naming the file.

    `PATH: cannot read <what>: ...` (missing, unreadable, not a regular file, too large),
    `PATH: <what> is not UTF-8 text ...`, or `PATH: not valid YAML at line L, column C: problem`
    (syntax, duplicate keys, nesting deeper than MAX_YAML_DEPTH, aliases expanding past MAX_YAML_VALUES).
    """
    p = Path(path)
    text = _decode(p, _read_capped(p, what), what)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
        if _expanded_size(data) > MAX_YAML_VALUES:
            raise _YamlRefused(f"holds more than {MAX_YAML_VALUES} values once its aliases are expanded")
        return data
    except _YamlRefused as err:
        where = f" at line {err.mark.line + 1}, column {err.mark.column + 1}" if err.mark is not None else ""
        raise ConfigError(f"{p}: not valid YAML{where}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{p}: not valid YAML{where}: {problem}") from None
    except RecursionError:  # belt and braces: the depth bound above should make this unreachable
        raise ConfigError(f"{p}: not valid YAML: nested too deeply") from None
    except (ValueError, OverflowError) as err:
        # PyYAML lets a few of its own conversions escape: `"\U0A0010000"` (chr() of a code point past
        # U+10FFFF), a date such as 2020-13-45 (datetime refuses the month).
        raise ConfigError(f"{p}: not valid YAML: {err}") from None
