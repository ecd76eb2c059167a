"""The `devcluster:` section of the configuration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError

from hpresilience.errors import ConfigError
from hpresilience.settings_base import Section, format_validation_error


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


def devcluster_settings(section: Mapping[str, Any], source: str = "<config>") -> DevclusterSettings:
    """The configuration's `devcluster:` section validated: ConfigError naming `source` and each bad key
    (`devcluster.nodes`). Only what starts a devcluster composes it; config.py keeps the section as written."""
    try:
        return DevclusterSettings.model_validate(dict(section))
    except ValidationError as err:
        raise ConfigError(format_validation_error(source, err, "devcluster")) from None
