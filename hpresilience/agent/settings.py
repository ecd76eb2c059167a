"""Configuration section for the node agent (schedule, guard rails, metrics address)."""

from __future__ import annotations

from hpresilience.settings_base import Section


class AgentSettings(Section):
    """Settings for the node agent (schedule, guard rails, metrics address); defaults work with no file."""
