"""Profiles: shipped files load, stay in sync with healthchecks/, and bad ones name file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.errors import ConfigError
from hpresilience.health.base import HostPaths, Kind
from hpresilience.health.profiles import (
    DATA_DIR,
    available_profiles,
    build_checks,
    load_profile,
    make_context,
)
from hpresilience.health.settings import HealthSettings

REPO = Path(__file__).parent.parent.parent
SHIPPED = [
    "g4dn",
    "g5",
    "generic",
    "hgx-h100-ndr",
    "p4d.24xlarge",
    "p5.48xlarge",
    "trn1.32xlarge",
    "trn2.48xlarge",
]


def settings(tmp_path: Path, **kw: object) -> HealthSettings:
    return HealthSettings(profile_dirs=[str(tmp_path / "profiles")], **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_loads_and_validates(name: str, tmp_path: Path) -> None:
    p = load_profile(settings(tmp_path), name)
    assert p.name == name and "system.cpu" in p.enabled()


def test_package_copies_match_healthchecks_dir() -> None:
    for f in sorted((REPO / "healthchecks").glob("*.yaml")):
        assert (DATA_DIR / f.name).read_text() == f.read_text(), f"{f.name} differs from the package copy"
    assert sorted(p.stem for p in (REPO / "healthchecks").glob("*.yaml")) == SHIPPED


def test_instance_profiles_set_expectations_and_switch_off_foreign_families(tmp_path: Path) -> None:
    p5 = load_profile(settings(tmp_path), "p5.48xlarge")
    assert (p5.expect.gpus, p5.expect.efa_devices) == (8, 32)
    assert p5.options["gpu.count"].required and "neuron.count" not in p5.enabled()
    trn2 = load_profile(settings(tmp_path), "trn2.48xlarge")  # extends trn1
    assert trn2.expect.neuron_devices == 16 and trn2.expect.efa_devices == 16
    assert "gpu.memory" not in trn2.enabled() and trn2.options["neuron.count"].required
    assert len(trn2.sources) == 3


def test_auto_picks_the_dmi_instance_type_else_generic(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    (sysfs / "devices/virtual/dmi/id").mkdir(parents=True)
    (sysfs / "devices/virtual/dmi/id/product_name").write_text("p4d.24xlarge\n")
    assert load_profile(settings(tmp_path), None, HostPaths(sysfs=sysfs)).name == "p4d.24xlarge"
    (sysfs / "devices/virtual/dmi/id/product_name").write_text("Standard PC (Q35 + ICH9, 2009)\n")
    assert load_profile(settings(tmp_path), None, HostPaths(sysfs=sysfs)).name == "generic"


def write(tmp_path: Path, name: str, text: str) -> Path:
    d = tmp_path / "profiles"
    d.mkdir(exist_ok=True)
    (d / f"{name}.yaml").write_text(text)
    return d / f"{name}.yaml"


def test_operator_profile_overrides_a_shipped_one(tmp_path: Path) -> None:
    write(tmp_path, "generic", "name: generic\nchecks:\n  system.cpu: {expected: 4}\n")
    s = settings(tmp_path)
    p = load_profile(s, "generic")
    assert p.enabled() == ["system.cpu"] and available_profiles(s)["generic"].parent == tmp_path / "profiles"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "name: x\nchecks:\n  gpu.memory: {max_remaps: 3}\n",
            r"x.yaml: checks.gpu.memory.max_remaps: unknown key",
        ),
        (
            "name: x\nchecks:\n  gpu.nonsense: {}\n",
            r"x.yaml: checks.gpu.nonsense: unknown check 'gpu.nonsense'; known",
        ),
        ("name: x\nchecksum: 1\n", r"x.yaml: checksum: unknown key"),
        ("name: x\nchecks:\n  dcgm.diag: {level: 9}\n", r"x.yaml: checks.dcgm.diag.level"),
        ("name: x\nextends: nowhere\n", r"unknown health profile 'nowhere'"),
        ("name: x\nextends: x\n", r"'extends' loops"),
        ("- just\n- a list\n", r"x.yaml: a profile must be a mapping"),
        ("name: [unclosed\n", r"x.yaml: not valid YAML"),
    ],
)
def test_bad_profiles_are_config_errors_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    write(tmp_path, "x", text)
    with pytest.raises(ConfigError, match=message):
        load_profile(settings(tmp_path), "x")


def test_unknown_profile_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"known profiles: g4dn, g5, generic, hgx-h100-ndr, p4d\.24xlarge"):
        load_profile(settings(tmp_path), "p9.huge")


def test_config_checks_tune_and_switch_off_over_the_profile(tmp_path: Path) -> None:
    s = settings(tmp_path, checks={"gpu.memory": {"max_uncorrectable_remaps": 100}, "xid": {"enabled": False}})
    p = load_profile(s, "p5.48xlarge")
    assert p.options["gpu.memory"].max_uncorrectable_remaps == 100  # type: ignore[attr-defined]
    assert "xid" not in p.enabled()


def test_build_checks_selects_kinds_and_explicit_names(tmp_path: Path) -> None:
    s = settings(tmp_path)
    p = load_profile(s, "generic")
    ctx = make_context(s, p)
    passive = build_checks(p, ctx)
    assert passive and all(c.kind == Kind.PASSIVE for c in passive)
    both = build_checks(p, ctx, (Kind.PASSIVE, Kind.ACTIVE))
    assert {c.name for c in both} - {c.name for c in passive} == {
        "system.stress",
        "dcgm.diag",
        "efa.loopback",
    }
    p5 = load_profile(s, "trn1.32xlarge")
    assert [c.name for c in build_checks(p5, ctx, only=["gpu.count"])] == ["gpu.count"]  # even if disabled
    with pytest.raises(ConfigError, match="unknown check 'nope'"):
        build_checks(p, ctx, only=["nope"])
