"""Base class for configuration sections (frozen, unknown keys are errors, no silent coercion), and the one
way a validation error is told: `source: key.path: message`, one line per problem.

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
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

# Ten years: above any interval, timeout or window a cluster uses; below every OverflowError.
MAX_SECONDS = 10 * 365 * 86400.0


def _accepts_bool(annotation: Any) -> bool:
    """Whether a field's type names bool (or Any) anywhere; a bool for any other field is a mistake."""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Literal):
        return any(
            a is bool or (origin is not typing.Literal and _accepts_bool(a)) for a in typing.get_args(annotation)
        ) or (origin is typing.Literal and any(isinstance(a, bool) for a in typing.get_args(annotation)))
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
        if (
            (info.field_name or "").endswith("_s")
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and (not math.isfinite(value) or value > MAX_SECONDS)
        ):
            raise ValueError(f"must be a finite number of seconds, at most {MAX_SECONDS:.0f} (ten years)")
        return value


Loc = Sequence[int | str]


def key_path(loc: Loc, prefix: str = "") -> str:
    """("groups", 0, "nodes") -> `groups[0].nodes`, as the YAML file reads; after `prefix` when one is given."""
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def validation_problems(err: ValidationError, prefix: str = "", skip: str | None = None) -> list[tuple[str, str]]:
    """(key path, message) per problem. `skip` drops a first key the reader never wrote (a wrapper field)."""
    out = []
    for e in err.errors():
        loc = tuple(e["loc"])
        if skip is not None and loc[:1] == (skip,):
            loc = loc[1:]
        out.append((key_path(loc, prefix), "unknown key" if e["type"] == "extra_forbidden" else e["msg"]))
    return out


def format_validation_error(source: str, err: ValidationError, prefix: str = "", skip: str | None = None) -> str:
    """One line per problem: `source: key.path: what was expected` (`unknown key` for a key no model has)."""
    return "\n".join(f"{source}: {path}: {msg}" for path, msg in validation_problems(err, prefix, skip))


def reference_error(message: str) -> PydanticCustomError:
    """For a validator: a name or value that does not resolve (an unknown provider, check or gate). Raised
    as is, its message reads without pydantic's "Value error, " in front."""
    # No context is given, so the message is used as written (braces included).
    return PydanticCustomError("invalid_reference", message)


class Problems:
    """Problems found by a validator that checks other parts (names against a registry, options against the
    model a registry entry names), raised as one ValidationError so that each keeps its own key path."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.errors: list[InitErrorDetails] = []

    def add(self, loc: Loc, message: str, value: Any = None) -> None:
        self.errors.append(InitErrorDetails(type=reference_error(message), loc=tuple(loc), input=value))

    def add_nested(self, loc: Loc, err: ValidationError, ignore: Sequence[str] = ()) -> None:
        """The errors of a model validated inside this one, under `loc`, but those of the types in `ignore`."""
        for e in err.errors():
            if e["type"] in ignore:
                continue
            self.errors.append(
                InitErrorDetails(type=PydanticCustomError(e["type"], e["msg"]), loc=(*loc, *e["loc"]), input=e["input"])
            )

    def raise_if_any(self) -> None:
        if self.errors:
            raise ValidationError.from_exception_data(self.title, self.errors)
