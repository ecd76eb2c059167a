"""Providers: how a node is rebooted or replaced. One small interface, implementations chosen by name.

A provider gets the node as Slurm reports it and the action, does it (or starts it: the loop then waits for
slurmd to register again) and returns one line saying what it did. It raises on failure; the loop counts
that as a failed attempt and escalates. Providers never decide anything about Slurm node states.

A provider is registered as a factory: a callable `(options, context) -> Provider`, usually the class itself.
When the factory has an `Options` model, a group's options are validated against it when the configuration
is loaded (`config show` names the bad key) and the factory gets the validated model; otherwise it gets them
as a plain dict. Site providers come from the configuration (`controller.providers: {name: "module:callable"}`)
or from installed packages (entry-point group `hpresilience.providers`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from hpresilience.errors import ConfigError
from hpresilience.reasons import Action
from hpresilience.registry import Registry
from hpresilience.settings_base import format_validation_error
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node

ENTRY_POINT_GROUP = "hpresilience.providers"


@dataclass(frozen=True)
class ProviderContext:
    client: SlurmClient
    group: str


class Provider(Protocol):
    name: str

    def act(self, node: Node, action: Action) -> str:
        """Reboot or replace `node` (`action` is Action.REBOOT or Action.REPLACE); one line describing what was
        done."""
        ...


Factory = Callable[[Any, ProviderContext], Provider]


def _callable(obj: Any) -> None:
    if not callable(obj):
        raise TypeError(
            f"is not callable (a provider is a class or function taking (options, context)), got {type(obj).__name__}"
        )


# Imported on first use: boto3 costs a second of start-up that clusters without AWS never need.
PROVIDERS: Registry[Factory] = Registry(
    "provider",
    {
        "reboot": "hpresilience.controller.providers.reboot:RebootProvider",
        "script": "hpresilience.controller.providers.script:ScriptProvider",
        "ec2": "hpresilience.controller.providers.ec2:Ec2Provider",
        "hyperpod": "hpresilience.controller.providers.hyperpod:HyperPodProvider",
    },
    validate=_callable,
    entry_point_group=ENTRY_POINT_GROUP,
)


def provider_registry(site: Mapping[str, str] | None = None) -> Registry[Factory]:
    """The built-in and installed providers, plus a configuration's own (`controller.providers`)."""
    return PROVIDERS.extended(site) if site else PROVIDERS


def options_model(factory: Factory) -> type[BaseModel] | None:
    model = getattr(factory, "Options", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def parse_options(factory: Factory, options: Mapping[str, Any]) -> Any:
    """The options as the factory takes them: its `Options` model when it has one (ValidationError when they
    do not fit), else a plain dict."""
    model = options_model(factory)
    return model.model_validate(dict(options)) if model is not None else dict(options)


def create_provider(
    name: str, options: Mapping[str, Any], context: ProviderContext, registry: Registry[Factory] | None = None
) -> Provider:
    """The provider `name` of `registry` (default: PROVIDERS) for one node group; ConfigError when the name is
    unknown or the options do not fit, naming the group and each bad key."""
    source = f"controller node group {context.group!r}, provider {name!r}"
    try:
        factory = (registry or PROVIDERS).get(name)
    except ConfigError as err:
        raise ConfigError(f"controller node group {context.group!r}: {err}") from None
    try:
        parsed = parse_options(factory, options)
    except ValidationError as err:
        raise ConfigError(format_validation_error(source, err)) from None
    return factory(parsed, context)
