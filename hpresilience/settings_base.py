"""Base class for configuration sections: frozen, unknown keys are errors, and no silent coercion.

What a section refuses beyond its own fields' constraints (issue 14):
- NaN and infinities in any float (`.inf` seconds would sleep forever while /healthz says healthy);
- a duration (a field named `*_s`) above MAX_SECONDS: the standard library's timeouts overflow past
  ~9.2e9 s, and no real interval is longer than a few years;
- `true`/`false` where a number is expected (pydantic would read `retries: true` as 1).
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

# Ten years: above any interval, timeout or window a cluster uses; below every OverflowError.
MAX_SECONDS = 10 * 365 * 86400.0


def _accepts_bool(annotation: Any) -> bool:
    """Whether a field's type names bool (or Any) anywhere; a bool for any other field is a mistake."""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Literal):
        return any(a is bool or (origin is not typing.Literal and _accepts_bool(a))
                   for a in typing.get_args(annotation)) or (
            origin is typing.Literal and any(isinstance(a, bool) for a in typing.get_args(annotation)))
    return False


def _numeric(annotation: Any) -> bool:
    """int/float, possibly optional, or a list of them: the fields where YAML's true/false would be coerced."""
    if annotation in (int, float):
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(_numeric(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        inner = typing.get_args(annotation)
        return bool(inner) and _numeric(inner[0])
    return False


class Section(BaseModel):
    """One block of the configuration file. Frozen once loaded; extra keys are rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None or not _numeric(field.annotation) or _accepts_bool(field.annotation):
            return value
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, bool) for v in items):
            raise ValueError("must be a number, not true/false")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _durations_bounded(cls, value: Any, info: ValidationInfo) -> Any:
        if ((info.field_name or "").endswith("_s") and isinstance(value, (int, float)) and not isinstance(value, bool)
                and (not math.isfinite(value) or value > MAX_SECONDS)):
            raise ValueError(f"must be a finite number of seconds, at most {MAX_SECONDS:.0f} (ten years)")
        return value
