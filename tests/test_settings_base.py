"""The one validation-error formatter and the problems a cross-part validator reports with their key paths."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError, model_validator

from hpresilience.settings_base import Problems, Section, format_validation_error, key_path


class Inner(Section):
    size: int = 1


class Outer(Section):
    items: list[Inner] = Field(default_factory=list)
    name: str = ""

    @model_validator(mode="after")
    def _cross_check(self) -> Outer:
        problems = Problems("Outer")
        if self.name == "bad":
            problems.add(("name",), "unknown thing 'bad' {not a template}; known: a, b", self.name)
        if self.name == "nested":
            try:
                Inner.model_validate({"sise": 2})
            except ValidationError as err:
                problems.add_nested(("extra", 0), err)
        problems.raise_if_any()
        return self


def test_key_paths_read_as_the_yaml_file_does() -> None:
    assert key_path(("controller", "groups", 0, "options", "x")) == "controller.groups[0].options.x"
    assert key_path((0, "bogusKey")) == "[0].bogusKey" and key_path(()) == "(top level)"
    assert key_path(("max_remaps",), "checks.gpu.memory") == "checks.gpu.memory.max_remaps"


def test_one_line_per_problem_and_unknown_key_for_extra_keys() -> None:
    with pytest.raises(ValidationError) as err:
        Outer.model_validate({"items": [{"size": "big"}, {"sixe": 1}], "nmae": "x"})
    assert format_validation_error("c.yaml", err.value, "top").splitlines() == [
        "c.yaml: top.items[0].size: Input should be a valid integer, unable to parse string as an integer",
        "c.yaml: top.items[1].sixe: unknown key",
        "c.yaml: top.nmae: unknown key",
    ]


def test_problems_keep_their_key_path_and_their_words() -> None:
    """A registry look-up failing inside a validator is told where it is, without "Value error, " in front
    and with braces left as written."""
    with pytest.raises(ValidationError) as err:
        Outer.model_validate({"name": "bad"})
    assert format_validation_error("c.yaml", err.value) == (
        "c.yaml: name: unknown thing 'bad' {not a template}; known: a, b"
    )
    with pytest.raises(ValidationError) as err:
        Outer.model_validate({"name": "nested"})
    assert format_validation_error("c.yaml", err.value) == "c.yaml: extra[0].sise: unknown key"
