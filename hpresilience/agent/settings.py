"""Configuration section for the node agent (schedule, guard rails, metrics address)."""

from __future__ import annotations

from hpresilience.settings_base import Section


class AgentSettings(Section):
    """Settings for the node agent (schedule, guard rails, metrics address). Every field has a default that works with no file."""
