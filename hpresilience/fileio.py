"""Small file helpers every part shares: atomic writes, and YAML reads whose errors name file and place."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from hpresilience.errors import ConfigError


def atomic_write_text(path: Path | str, text: str, fsync: bool = False) -> None:
    """Write `text` so that readers see the old file or the new one, never half of it (temp file + rename
    in the same directory). With `fsync`, the data is on disk before the rename: state that must survive a
    crash of the machine, not just of the process."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
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


def read_yaml(path: Path | str, what: str = "file") -> Any:
    """Parse a YAML file; ConfigError `PATH: cannot read <what>: ...` or `PATH: not valid YAML at line L, column C:
    problem` on failure."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError(f"{p}: cannot read {what}: {err.strerror or err}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{p}: not valid YAML{where}: {problem}") from None
