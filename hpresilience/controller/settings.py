"""Configuration section for the head-node replacement controller."""

from __future__ import annotations

import importlib.util
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from hpresilience.controller.gates import GateSettings
from hpresilience.errors import ConfigError, SlurmParseError
from hpresilience.reasons import Action
from hpresilience.settings_base import Problems, Section
from hpresilience.slurm.hostlist import expand

DEFAULT_LADDER: tuple[Action, ...] = (Action.REBOOT, Action.REPLACE, Action.REPLACE)


def not_installed_here(target: str) -> bool:
    """Whether the module of a `module:callable` declaration cannot be found on this machine (its package is
    not installed here); a malformed declaration is not this case and is reported as such."""
    module, sep, attr = target.partition(":")
    if not sep or not module.strip() or not attr.strip():
        return False
    try:
        return importlib.util.find_spec(module.strip()) is None
    except (ImportError, ValueError):  # a parent package missing, or a relative name
        return True


class NodeGroup(Section):
    """Nodes that share a provider: `nodes` are hostlist expressions (`gpu-[1-64]`) or globs (`gpu-*`)."""

    name: str = Field(min_length=1)
    nodes: list[str] = Field(min_length=1)
    provider: str = "reboot"
    # Provider-specific settings, validated at load against the provider's Options model (unknown keys are errors).
    options: dict[str, Any] = Field(default_factory=dict)
    # Seconds a repaired node has to register again with slurmd; None: `come_back_timeout_s`.
    come_back_timeout_s: float | None = Field(default=None, gt=0)

    @field_validator("nodes")
    @classmethod
    def _patterns_parse(cls, nodes: list[str]) -> list[str]:
        # A hostlist typo must fail at load (and in `config show`), not in every cycle while no node is repaired.
        for pattern in nodes:
            if not pattern.strip():
                raise ValueError("an empty node pattern matches nothing")
            if "[" in pattern or "]" in pattern:
                try:
                    expand(pattern)
                except SlurmParseError as err:
                    raise ValueError(str(err)) from None
        return nodes


class ControllerSettings(Section):
    """Settings for the head-node replacement controller. Every field has a default that works with no file."""

    # One Slurm query per cycle; a repair moves at most one step per cycle.
    poll_interval_s: float = Field(default=10.0, gt=0)
    # Per-node state files (and the lock that keeps a second controller out) live here.
    state_dir: str = "/var/lib/hpresilience/controller"
    # A FAILING/draining node still running jobs is waited for this long, then forced DOWN.
    forced_down_after_s: float = Field(default=600.0, ge=0)
    # At most this many nodes are being repaired (provider action, coming back, health gate) at once.
    max_concurrent: int = Field(default=4, ge=1)
    come_back_timeout_s: float = Field(default=1800.0, gt=0)
    # The escalation ladder: a repair starts at the first rung of the requested action and moves one rung
    # up each time the node does not come back or fails the gate; past the last rung it is left for a person.
    ladder: list[Action] = Field(default_factory=lambda: list(DEFAULT_LADDER), min_length=1)
    # A node repaired this many times within lemon_window_s is not put back after its last repair: it stays
    # drained with a reason starting "hpr: needs a person" that names its repairs (step "lemon" in status).
    lemon_repairs: int = Field(default=3, ge=1)
    lemon_window_s: float = Field(default=7 * 86400.0, gt=0)
    # Also repair nodes that `scontrol reboot` left behind (reason "Reboot ASAP"/"reboot timed out", drained).
    repair_reboot_leftovers: bool = True
    # Also repair (as a reboot) nodes that are DOWN with no reason or only Slurm's own (`down_reasons`), once
    # they have stayed so for `down_grace_s`: off by default, as a node restarting on purpose looks the same.
    repair_down_without_reason: bool = False
    down_reasons: list[str] = Field(default_factory=lambda: ["", "Not responding", "Node unexpectedly rebooted"])
    down_grace_s: float = Field(default=300.0, ge=0)
    default_provider: str = "reboot"
    default_options: dict[str, Any] = Field(default_factory=dict)
    # Site providers: name -> "module:callable", imported when the file is loaded (docs/controller.md).
    providers: dict[str, str] = Field(default_factory=dict)
    groups: list[NodeGroup] = Field(default_factory=list)
    gate: GateSettings = Field(default_factory=GateSettings)
    # Log every decision but change nothing (no Slurm writes, no provider calls, no state files).
    dry_run: bool = False
    # Jobs that srun --auto-resume requeued (marker in the job's comment) are started at once instead of after
    # Slurm's requeue hold (cred_expire + 1 s, two minutes by default); looked for this often. 0: never.
    release_requeued_every_s: float = Field(default=2.0, ge=0)
    # Each release looks only at the jobs told of a bad node lately (one job query each); the whole pending
    # queue, whose cost grows with the queue, is read only this often (for requeues of other causes). 0: never.
    release_scan_every_s: float = Field(default=60.0, ge=0)
    # Running jobs on a bad node are told so in their AdminComment (slurm/adminword.py) this often, so that no
    # srun --auto-resume job has to read node state itself. 0: never (each wrapper then reads its nodes).
    notify_jobs_every_s: float = Field(default=1.0, ge=0)
    # The running batch jobs (from slurmdbd) get a watch lease in their AdminComment this often (new ones, and
    # renewals every 5 min), so that their wrappers stop reading their job every poll (controller/jobwords.py).
    # 0: no leases (each wrapper then reads its job every poll).
    watch_jobs_every_s: float = Field(default=30.0, ge=0)
    # Prometheus /metrics and /healthz; loopback by default. Empty disables the server.
    metrics_address: str = "127.0.0.1:9760"

    @field_validator("ladder")
    @classmethod
    def _ladder_has_both(cls, ladder: list[Action]) -> list[Action]:
        if Action.NONE in ladder:
            raise ValueError("a rung of the ladder is 'reboot' or 'replace', not 'none'")
        if Action.REPLACE not in ladder:
            raise ValueError("the ladder must contain 'replace' (an Action:Replace request starts there)")
        return ladder

    @model_validator(mode="after")
    def _group_names_unique(self) -> ControllerSettings:
        # Group names key the repair state and the metrics; "default" is the name of nodes in no group.
        seen: set[str] = set()
        for g in self.groups:
            if g.name == "default":
                raise ValueError("node group name 'default' is reserved for nodes in no group")
            if g.name in seen:
                raise ValueError(f"node group name {g.name!r} is used twice")
            seen.add(g.name)
        return self

    @model_validator(mode="after")
    def _providers_known(self) -> ControllerSettings:
        # A provider typo or a bad option must fail `config show`, not the controller's start; all at once.
        if not self.model_fields_set & {"providers", "groups", "default_provider", "default_options"}:
            return self  # the defaults are known good; every config load would import the providers otherwise
        from hpresilience.controller.providers import parse_options, provider_registry

        problems = Problems("ControllerSettings")
        known = provider_registry(self.providers)
        broken: set[str] = set()
        for name in self.providers:
            if not_installed_here(self.providers[name]):
                # Only the head node needs a site provider, and every node loads this file: a module that is
                # not installed here stops only the controller, at its start (exit 2 naming it).
                broken.add(name)
                continue
            try:
                known.get(name)
            except ConfigError as err:
                problems.add(("providers", name), str(err), self.providers[name])
                broken.add(name)
        uses: list[tuple[tuple[str | int, ...], tuple[str | int, ...], str, dict[str, Any]]] = [
            (("default_provider",), ("default_options",), self.default_provider, self.default_options)
        ]
        uses += [
            (("groups", i, "provider"), ("groups", i, "options"), g.provider, g.options)
            for i, g in enumerate(self.groups)
        ]
        for name_loc, options_loc, name, options in uses:
            if name in broken:
                continue
            try:
                factory = known.get(name)
            except ConfigError as err:
                problems.add(name_loc, str(err), name)
                continue
            try:
                parse_options(factory, options)
            except ValidationError as err:
                problems.add_nested(options_loc, err)
        problems.raise_if_any()
        return self
