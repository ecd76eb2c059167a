"""Fuzz: the configuration loader (read_yaml + the Config model + `config show`'s dump) on generated files.

Files are shaped on the schema (real section and key names, values of the right type or a hostile one),
serialized as YAML and then sometimes damaged at the byte level. Every one must load or be refused with a
ConfigError: no other exception, and a loaded one must dump (what `config show` prints). Budget: tests/fuzz.py.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from hpresilience.config import Config, config_as_dict, load_config
from hpresilience.errors import HPResilienceError
from tests.fuzz import SCALARS, count, fuzz_settings, json_like, mutate_bytes, scratch_dir

_CACHE: dict[tuple[Any, int], st.SearchStrategy[Any]] = {}


def value_for(annotation: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """A value of the annotated type, or (one time in three) anything at all."""
    key = (annotation, depth)
    if key not in _CACHE:
        _CACHE[key] = st.deferred(lambda: _value_for(annotation, depth))
    return _CACHE[key]


def _value_for(annotation: Any, depth: int) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        typed: st.SearchStrategy[Any] = shaped(annotation, depth + 1) if depth < 3 else st.just({})
    elif origin is typing.Literal:
        typed = st.sampled_from(typing.get_args(annotation))
    elif origin in (typing.Union, types.UnionType):
        typed = st.one_of([value_for(a, depth) for a in typing.get_args(annotation)])
    elif origin is list:
        typed = st.lists(value_for(typing.get_args(annotation)[0], depth + 1), max_size=3)
    elif origin is dict:
        k, v = typing.get_args(annotation)
        typed = st.dictionaries(value_for(k, depth + 1), value_for(v, depth + 1), max_size=2)
    elif annotation is bool:
        typed = st.booleans()
    elif annotation is int:
        typed = st.integers(-5, 10**6)
    elif annotation is float:
        typed = st.floats(allow_nan=True, allow_infinity=True)
    elif annotation is str:
        typed = st.text(max_size=20)
    else:
        typed = json_like(4)
    return st.one_of(typed, typed, SCALARS)


def shaped(model: type[BaseModel], depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """A few of the model's keys (aliases as a file spells them) with values for their types, and now and
    then a key the model does not know."""
    fields = [((f.alias or name), value_for(f.annotation, depth)) for name, f in model.model_fields.items()]
    return _shaped(tuple(fields))


@st.composite
def _shaped(draw: st.DrawFn, fields: tuple[tuple[str, st.SearchStrategy[Any]], ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(draw(st.integers(0, 3))):
        key, values = fields[draw(st.integers(0, len(fields) - 1))]
        out[key] = draw(values)
    if draw(st.integers(0, 5)) == 0:
        out[draw(st.text(max_size=8))] = draw(SCALARS)
    return out


@st.composite
def config_files(draw: st.DrawFn) -> bytes:
    doc = draw(st.one_of(shaped(Config), shaped(Config), shaped(Config), json_like(6)))
    text = yaml.safe_dump(doc, allow_unicode=draw(st.booleans()), default_flow_style=draw(st.booleans()))
    return mutate_bytes(text.encode("utf-8", "surrogatepass"), draw)


_DIR = scratch_dir()


@fuzz_settings()
@given(data=config_files())
def test_config_loader_accepts_or_refuses_clearly(data: bytes) -> None:
    path = _DIR / "config.yaml"
    path.write_bytes(data)
    try:
        cfg = load_config(path)
        json.dumps(config_as_dict(cfg))  # `config show`
    except HPResilienceError:
        count("config loader", "clear_error")
        return
    except Exception:
        count("config loader", "crash")
        raise
    count("config loader", "accepted")
