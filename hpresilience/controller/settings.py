"""Configuration section for the head-node replacement controller."""

from __future__ import annotations

from hpresilience.settings_base import Section


class ControllerSettings(Section):
    """Settings for the head-node replacement controller. Every field has a default that works with no file."""
