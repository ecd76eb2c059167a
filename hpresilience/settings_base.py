"""Base class for configuration sections: frozen, and unknown keys are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """One block of the configuration file. Frozen once loaded; extra keys are rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
