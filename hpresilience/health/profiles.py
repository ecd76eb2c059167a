"""Check profiles: which checks run on an instance type, with which thresholds and expected device counts.

A profile is a YAML file named after the instance type (`p5.48xlarge.yaml`) or a role (`generic.yaml`):

    name: p5.48xlarge
    extends: generic            # optional: start from another profile
    expect: {gpus: 8, efa_devices: 32}
    checks:
      gpu.count: {required: true}
      gpu.memory: {max_uncorrectable_remaps: 512}
      efa.loopback: {enabled: false}

Only the checks listed run; `enabled: false` switches one off. Operator directories (config
`health.profile_dirs`) are searched before the profiles shipped in the package, and the config's
`health.checks` is applied on top. Unknown keys, unknown checks and bad values are ConfigErrors that
name the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from hpresilience.errors import ConfigError
from hpresilience.fileio import read_yaml
from hpresilience.health.base import (
    AnyCheck,
    CheckContext,
    CheckOptions,
    Expectation,
    HostPaths,
    Kind,
    read_text,
)
from hpresilience.health.checks import CHECKS
from hpresilience.health.settings import HealthSettings
from hpresilience.settings_base import Section, format_validation_error

DATA_DIR = Path(__file__).parent / "data"
NOT_PROFILES = {"xid-catalog"}


class Expect(Section):
    gpus: int | None = Field(default=None, ge=0)
    neuron_devices: int | None = Field(default=None, ge=0)
    efa_devices: int | None = Field(default=None, ge=0)


class ProfileFile(Section):
    name: str
    description: str = ""
    extends: str | None = None
    expect: dict[str, int] = Field(default_factory=dict)
    checks: dict[str, dict[str, Any] | None] = Field(default_factory=dict)


@dataclass
class Profile:
    name: str
    sources: list[str]
    expect: Expect
    options: dict[str, CheckOptions] = field(default_factory=dict)

    def enabled(self) -> list[str]:
        return [n for n, o in self.options.items() if o.enabled]


def search_dirs(settings: HealthSettings) -> list[Path]:
    return [Path(d) for d in settings.profile_dirs] + [DATA_DIR]


def available_profiles(settings: HealthSettings) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in reversed(search_dirs(settings)):  # earlier directories win
        for p in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            if p.stem not in NOT_PROFILES:
                found[p.stem] = p
    return dict(sorted(found.items()))


def detect_instance_type(paths: HostPaths) -> str | None:
    """EC2 puts the instance type in DMI's product_name ("p5.48xlarge")."""
    text = read_text(paths.sys("devices", "virtual", "dmi", "id", "product_name"))
    return text or None


def auto_profile(itype: str | None, files: dict[str, Path]) -> str:
    """The instance type's own profile, else its family's (`g5` for g5.2xlarge), else generic."""
    if itype and itype in files:
        return itype
    family = (itype or "").split(".", 1)[0]
    if family and family in files:
        return family
    return "generic"


def _load_file(path: Path) -> ProfileFile:
    data = read_yaml(path, "profile")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a profile must be a mapping with name/expect/checks")
    try:
        return ProfileFile.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(str(path), err)) from None


def _merge_chain(name: str, files: dict[str, Path], seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[str]]:
    if name in seen:
        raise ConfigError(f"profile {name!r}: 'extends' loops: {' -> '.join((*seen, name))}")
    if name not in files:
        raise ConfigError(f"unknown health profile {name!r}; known profiles: {', '.join(files) or '(none)'}")
    pf = _load_file(files[name])
    expect: dict[str, Any] = {}
    checks: dict[str, dict[str, Any]] = {}
    sources: list[str] = []
    if pf.extends:
        base, sources = _merge_chain(pf.extends, files, (*seen, name))
        expect, checks = dict(base["expect"]), {k: dict(v) for k, v in base["checks"].items()}
    expect.update(pf.expect)
    for check, opts in pf.checks.items():
        checks[check] = {**checks.get(check, {}), **(opts or {}), "__source__": str(files[name])}
    return {"expect": expect, "checks": checks}, [*sources, str(files[name])]


def load_profile(settings: HealthSettings, name: str | None = None, paths: HostPaths | None = None) -> Profile:
    """Resolve a profile by name (or settings.profile; "auto" = detect), validated against the registry."""
    files = available_profiles(settings)
    wanted = name or settings.profile
    if wanted == "auto":
        wanted = auto_profile(detect_instance_type(paths or HostPaths()), files)
    merged, sources = _merge_chain(wanted, files)
    try:
        expect = Expect.model_validate(merged["expect"])
    except ValidationError as err:
        raise ConfigError(format_validation_error(sources[-1], err, "expect")) from None
    checks: dict[str, dict[str, Any]] = merged["checks"]
    for cname, over in settings.checks.items():
        checks[cname] = {**checks.get(cname, {}), **over, "__source__": "config health.checks"}
    options: dict[str, CheckOptions] = {}
    for cname, raw in checks.items():
        source = raw.pop("__source__", sources[-1])
        try:
            cls = CHECKS.get(cname)
        except ConfigError as err:
            raise ConfigError(f"{source}: checks.{cname}: {err}") from None
        try:
            options[cname] = cls.Options.model_validate(raw)
        except ValidationError as err:
            raise ConfigError(format_validation_error(source, err, f"checks.{cname}")) from None
    return Profile(wanted, sources, expect, options)


def make_context(settings: HealthSettings, profile: Profile | None = None, strict: bool = False) -> CheckContext:
    p = settings.path
    expect = Expectation(**profile.expect.model_dump()) if profile else Expectation()
    return CheckContext(
        paths=HostPaths(Path(p.sysfs), Path(p.procfs), Path(p.dev)),
        commands=settings.commands.model_dump(),
        state_dir=Path(settings.state_dir),
        kernel_log=settings.kernel_log,
        nvml=settings.nvml,
        xid_overrides=dict(settings.xid_overrides),
        reboots_before_replace=settings.reboots_before_replace,
        escalation_window_s=settings.escalation_window_s,
        expect=expect,
        strict=strict,
    )


def build_checks(
    profile: Profile,
    ctx: CheckContext,
    kinds: tuple[Kind, ...] = (Kind.PASSIVE,),
    only: list[str] | None = None,
) -> list[AnyCheck]:
    """Instantiate the profile's enabled checks of the given kinds (or exactly `only`, enabled or not)."""
    out: list[AnyCheck] = []
    names = only if only else profile.enabled()
    for n in names:
        cls = CHECKS.get(n)
        opts = profile.options.get(n) or cls.Options()
        if only:
            opts = opts.model_copy(update={"enabled": True})
        elif cls.kind not in kinds:
            continue
        out.append(cls(opts, ctx))
    return out
