"""Providers: how a node is rebooted or replaced. One small interface, implementations chosen by name.

A provider gets the node as Slurm reports it and the action, does it (or starts it: the loop then waits for
slurmd to register again) and returns one line saying what it did. It raises on failure; the loop counts
that as a failed attempt and escalates. Providers never decide anything about Slurm node states.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from hpresilience.errors import ConfigError
from hpresilience.settings_base import Section
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node


@dataclass(frozen=True)
class ProviderContext:
    client: SlurmClient
    group: str


class Provider(Protocol):
    name: str

    def act(self, node: Node, action: str) -> str:
        """Reboot or replace `node` (`action` is "reboot" or "replace"); one line describing what was done."""
        ...


Factory = Callable[[Mapping[str, Any], ProviderContext], Provider]

# Imported on first use: boto3 costs a second of start-up that clusters without AWS never need.
PROVIDERS: dict[str, str] = {
    "reboot": "hpresilience.controller.providers.reboot:RebootProvider.create",
    "script": "hpresilience.controller.providers.script:ScriptProvider.create",
    "ec2": "hpresilience.controller.providers.ec2:Ec2Provider.create",
    "hyperpod": "hpresilience.controller.providers.hyperpod:HyperPodProvider.create",
}


def register(name: str, target: str) -> None:
    """Add a provider: `target` is "module:Class.factory" (or "module:function") taking (options, context)."""
    PROVIDERS[name] = target


def _resolve(target: str) -> Factory:
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    factory: Factory = obj
    return factory


def create_provider(name: str, options: Mapping[str, Any], context: ProviderContext) -> Provider:
    if name not in PROVIDERS:
        raise ConfigError(f"node group {context.group!r}: unknown provider {name!r}; known: "
                          f"{', '.join(sorted(PROVIDERS))}")
    return _resolve(PROVIDERS[name])(options, context)


S = TypeVar("S", bound=Section)


def parse_options(model: type[S], options: Mapping[str, Any], provider: str, group: str) -> S:
    """Validate a provider's options; one ConfigError naming the group, provider and each bad key."""
    try:
        return model.model_validate(dict(options))
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(options)'}: "
                             f"{'unknown key' if e['type'] == 'extra_forbidden' else e['msg']}" for e in err.errors())
        raise ConfigError(f"controller node group {group!r}, provider {provider!r}: {problems}") from None
