"""Configuration section for health checks (profiles, XID overrides, hardware paths)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from hpresilience.errors import ConfigError
from hpresilience.settings_base import Problems, Section

XidActionName = Literal["none", "warn", "reboot", "replace", "reboot_then_replace"]


class PathSettings(Section):
    """Roots every hardware path is read under (node_exporter's --path.* convention)."""

    sysfs: str = "/sys"
    procfs: str = "/proc"
    dev: str = "/dev"


class CommandSettings(Section):
    """External tools: a bare name is looked up on PATH, anything with a slash is used as is."""

    nvidia_smi: str = "nvidia-smi"
    dcgmi: str = "dcgmi"
    fi_info: str = "fi_info"
    fi_pingpong: str = "fi_pingpong"
    stress_ng: str = "stress-ng"
    dmesg: str = "dmesg"
    systemctl: str = "systemctl"


class HealthSettings(Section):
    """Settings for health checks (profiles, XID overrides, hardware paths).

    Every field has a default that works with no file.
    """

    # Profile name ("generic", "p5.48xlarge", ...) or "auto": the EC2 instance type from DMI, else generic.
    profile: str = "auto"
    # Operator profiles, searched before the ones shipped in the package; a file here wins over a shipped one.
    profile_dirs: list[str] = Field(default_factory=lambda: ["/etc/hpresilience/healthchecks"])
    path: PathSettings = Field(default_factory=PathSettings)
    commands: CommandSettings = Field(default_factory=CommandSettings)
    # Kernel log: empty means <path.dev>/kmsg, falling back to the `dmesg` command when kmsg cannot be read.
    kernel_log: str = ""
    # NVML source: "auto" (pynvml, then `nvidia-smi -q -x`), "pynvml", "nvidia-smi", or a recorded JSON path.
    nvml: str = "auto"
    # What must survive a reboot: escalation history, counter baselines.
    state_dir: str = "/var/lib/hpresilience/health"
    # Per-XID action override, e.g. {79: replace, 13: warn}; the shipped catalogue covers the rest.
    xid_overrides: dict[int, XidActionName] = Field(default_factory=dict)
    # Reboot-then-replace: a fault that comes back after this many reboots asks for a replacement.
    reboots_before_replace: int = Field(default=2, ge=0, le=20)
    # Escalation history older than this is forgotten (a fault a month ago is not "the same fault returning").
    escalation_window_s: float = Field(default=14 * 86400.0, gt=0)
    # Per-check tuning over the profile, e.g.
    # {"gpu.memory": {"max_uncorrectable_remaps": 256}, "efa.loopback": {"enabled": false}}.
    checks: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("nvml")
    @classmethod
    def _known_nvml_source(cls, v: str) -> str:
        # A typo must not be read as the path of a recording that does not exist: that made gpu.count fail
        # with action reboot on every GPU node.
        from hpresilience.health.nvml import nvml_source_error

        problem = nvml_source_error(v)
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("checks")
    @classmethod
    def _checks_known(cls, checks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        # An option typo must fail `config show`, not the agent's first cycle. Each entry tunes a profile's
        # check, so it is validated alone: a model's required keys may come from the profile (none do today).
        from hpresilience.health.checks import CHECKS

        problems = Problems("HealthSettings.checks")
        for name, options in checks.items():
            try:
                check = CHECKS.get(name)
            except ConfigError as err:
                problems.add((name,), str(err), name)
                continue
            try:
                check.Options.model_validate(options)
            except ValidationError as err:
                problems.add_nested((name,), err, ignore=("missing",))
        problems.raise_if_any()
        return checks
