"""Configuration section for the head-node replacement controller."""

from __future__ import annotations

from hpresilience.settings_base import Section


class ControllerSettings(Section):
    """Settings for the head-node replacement controller. Defaults work with no file."""
