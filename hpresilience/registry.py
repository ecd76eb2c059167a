"""One registry style for every extension point: health checks, controller providers, gates, CLI commands.

An entry is the object itself or a lazy `"module:attr"` string imported on first use: boto3 costs a
second of start-up that clusters without AWS never need, so the ec2 and hyperpod providers stay
unimported until a configuration names them. A registry may also read a package entry-point group
(`hpresilience.providers`), so a site package is known wherever it is installed, without code of ours
importing it first. Every failure to find or import an entry is a ConfigError that says which kind of
thing was asked for and lists the known names: it is almost always a typo in a file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

from hpresilience.errors import ConfigError, missing_extra

T = TypeVar("T")


def import_target(target: str) -> Any:
    """`"package.module:Class.attr"` -> that object; ConfigError when it is malformed or cannot be imported."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise ConfigError(f"{target!r} is not 'module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        # An optional extra not installed is no typo: say which extra (an EnvironmentMissing, not a ConfigError).
        extra = missing_extra(err)
        if extra is not None:
            raise extra from None
        raise ConfigError(f"cannot import {module_name!r} ({type(err).__name__}: {err})") from None
    except Exception as err:  # noqa: BLE001 - a site module may fail in any way; the file named it
        raise ConfigError(f"cannot import {module_name!r} ({type(err).__name__}: {err})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


class Registry(Generic[T]):
    """Named entries of one kind (`kind` names them in messages: "unknown provider 'ipmi'; known: ...").

    `validate` vets an entry once it is imported (e.g. "must be callable"), raising ValueError or TypeError;
    `entry_point_group` adds the entry points of installed packages, read on the first look-up that needs them.
    Entries given here win over entry points of the same name.
    """

    def __init__(
        self,
        kind: str,
        entries: Mapping[str, T | str] | None = None,
        *,
        validate: Callable[[Any], None] | None = None,
        entry_point_group: str | None = None,
    ) -> None:
        self.kind = kind
        self._entries: dict[str, T | str] = dict(entries or {})
        self._validate = validate
        self._group = entry_point_group
        self._group_read = entry_point_group is None

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, target: T | str, *, replace: bool = False) -> T | str: ...

    def register(
        self, name: str, target: T | str | None = None, *, replace: bool = False
    ) -> Callable[[T], T] | T | str:
        """Add `target` under `name`; without a target, a decorator. A second, different entry for a name
        is a programming error unless `replace` says it is meant."""
        if target is None:

            def decorator(obj: T) -> T:
                self.register(name, obj)
                return obj

            return decorator
        if not name:
            raise TypeError(f"a {self.kind} needs a name")
        old = self._entries.get(name)
        if old is not None and old != target and not replace:
            raise TypeError(f"{self.kind} name {name!r} registered twice")
        if self._validate is not None and not isinstance(target, str):
            self._validate(target)
        self._entries[name] = target
        return target

    def extended(self, entries: Mapping[str, T | str]) -> Registry[T]:
        """A copy with `entries` added (they win over same-named ones): site entries from a configuration
        file, without changing the registry every other caller sees."""
        self._read_entry_points()
        out: Registry[T] = Registry(self.kind, {**self._entries, **entries}, validate=self._validate)
        return out

    def get(self, name: str) -> T:
        """The entry, imported if it was a string; ConfigError naming the known ones when there is none."""
        if name not in self._entries:
            self._read_entry_points()
        if name not in self._entries:
            known = ", ".join(self.names()) or "(none)"
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {known}")
        entry = self._entries[name]
        if not isinstance(entry, str):
            return entry
        try:
            obj = import_target(entry)
            if self._validate is not None:
                self._validate(obj)
        except ConfigError as err:
            raise ConfigError(f"{self.kind} {name!r}: {err}") from None
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{self.kind} {name!r}: {entry} {err}") from None
        self._entries[name] = obj  # imported once
        resolved: T = obj
        return resolved

    def names(self) -> list[str]:
        self._read_entry_points()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._read_entry_points()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def _read_entry_points(self) -> None:
        if self._group_read:
            return
        self._group_read = True
        from importlib.metadata import entry_points  # 20 ms: only for a registry that reads a group

        for ep in entry_points(group=self._group or ""):
            self._entries.setdefault(ep.name, ep.value)
