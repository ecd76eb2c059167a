"""Configuration section for health checks (profiles, XID overrides, hardware paths)."""

from __future__ import annotations

from hpresilience.settings_base import Section


class HealthSettings(Section):
    """Settings for health checks (profiles, XID overrides, hardware paths). Defaults work with no file."""
