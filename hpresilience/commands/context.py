"""What every command gets: the global options, the configuration loaded once, and report output."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import click

from hpresilience.config import Config, load_config
from hpresilience.log import printable, setup_logging


@dataclass
class Ctx:
    config_path: str | None
    json_output: bool
    verbose: bool
    _config: Config | None = None

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path)
            setup_logging(
                level="debug" if self.verbose else self._config.logging.level, json=self._config.logging.json_lines
            )
        return self._config

    def emit(self, data: Any, text: str) -> None:
        """Print a report: JSON with --json (which escapes every control character), the human text otherwise,
        its control characters but newline and tab shown as escapes: a report quotes text users wrote
        (ledgers, job fields, reasons), and nothing of it may reach a terminal as a control sequence."""
        click.echo(
            json.dumps(data, indent=2, sort_keys=True, default=str)
            if self.json_output
            else printable(text, keep_newlines=True)
        )


pass_ctx = click.make_pass_decorator(Ctx)
