"""Configuration section for srun --auto-resume (log rules, restart policy, spares)."""

from __future__ import annotations

from hpresilience.settings_base import Section


class AutoResumeSettings(Section):
    """Settings for srun --auto-resume (log rules, restart policy, spares). Defaults work with no file."""
