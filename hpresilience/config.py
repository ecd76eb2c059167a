"""Typed, validated configuration: one YAML file for every part, loaded once.

Where the file comes from: `--config PATH`, else `$HPRESILIENCE_CONFIG`, else
`/etc/hpresilience/config.yaml` when it exists, else no file (the defaults work).
A bad file raises ConfigError naming the file, the key path and what was expected.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from hpresilience.agent.settings import AgentSettings
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.controller.settings import ControllerSettings
from hpresilience.errors import ConfigError
from hpresilience.fileio import read_yaml
from hpresilience.health.settings import HealthSettings
from hpresilience.log import LoggingSettings
from hpresilience.settings_base import Section, format_validation_error
from hpresilience.slurm.settings import SlurmSettings

DEFAULT_CONFIG_PATH = Path("/etc/hpresilience/config.yaml")
ENV_VAR = "HPRESILIENCE_CONFIG"


class Config(Section):
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    # The embedded test cluster's section, kept as written: it is validated where a devcluster is started
    # (testing/settings.py's devcluster_settings, from the devcluster and demo commands), so that no runtime part
    # imports testing/.
    devcluster: dict[str, Any] = Field(default_factory=dict)
    health: HealthSettings = Field(default_factory=HealthSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    autoresume: AutoResumeSettings = Field(default_factory=AutoResumeSettings)


def config_from_mapping(data: Any, source: str = "<config>") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(source, err)) from None


def resolve_config_path(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load and validate the configuration; with no file anywhere, the defaults."""
    p = resolve_config_path(path)
    if p is None:
        return Config()
    return config_from_mapping(read_yaml(p, "configuration file"), str(p))


def config_as_dict(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(mode="json", by_alias=True)
