"""The `devcluster:` section of the configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpresilience.settings_base import Section


class DevclusterSettings(Section):
    """The embedded local Slurm cluster used by tests and the demo."""

    state_dir: str = ".devcluster"
    nodes: int = Field(default=4, ge=1, le=64)
    # Extra slurm.conf settings (SlurmdTimeout, ...), appended after ours so they win.
    overrides: dict[str, str] = Field(default_factory=dict)
    base_port: int = Field(default=17817, ge=1024, le=65000)
    # None: MariaDB + slurmdbd when their Debian packages are installed; true requires them; false: none.
    accounting: bool | None = None
    extra_nodes: int = Field(default=0, ge=0, le=100_000)
    proctrack: Literal["auto", "cgroup", "pgid"] = "auto"
