"""The one registry style: named entries, lazy "module:attr" targets, entry points, clear unknown-name errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hpresilience.errors import ConfigError
from hpresilience.registry import Registry, import_target


@pytest.fixture()
def site_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A throwaway module on sys.path, counting how often it is imported."""
    name = f"site_ext_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "IMPORTS = []\nIMPORTS.append(1)\n\ndef thing():\n    return 'made'\n\n"
        "class Holder:\n    class Inner:\n        value = 7\n\nNOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_register_get_names_and_the_decorator() -> None:
    reg: Registry[Callable[[], str]] = Registry("widget")

    @reg.register("b")
    def b() -> str:
        return "b"

    reg.register("a", lambda: "a")
    assert reg.names() == ["a", "b"] and list(reg) == ["a", "b"] and len(reg) == 2
    assert reg.get("b") is b and "a" in reg and "c" not in reg


def test_an_unknown_name_is_a_config_error_listing_the_known_ones() -> None:
    reg: Registry[int] = Registry("provider", {"reboot": 1, "ec2": 2, "script": 3})
    with pytest.raises(ConfigError, match=r"^unknown provider 'ipmi'; known: ec2, reboot, script$"):
        reg.get("ipmi")
    with pytest.raises(ConfigError, match=r"unknown gate 'x'; known: \(none\)"):
        Registry[int]("gate").get("x")


def test_a_second_entry_for_a_name_is_refused_unless_replacing() -> None:
    reg: Registry[int] = Registry("check", {"x": 1})
    reg.register("x", 1)  # the same entry again (a module imported twice) is fine
    with pytest.raises(TypeError, match="check name 'x' registered twice"):
        reg.register("x", 2)
    reg.register("x", 2, replace=True)
    assert reg.get("x") == 2


def test_string_entries_are_imported_on_first_use_only(site_module: str) -> None:
    reg: Registry[Any] = Registry("thing", {"t": f"{site_module}:thing", "inner": f"{site_module}:Holder.Inner"})
    assert site_module not in sys.modules and reg.names() == ["inner", "t"]  # listing imports nothing
    assert reg.get("t")() == "made"
    assert reg.get("inner").value == 7
    assert reg.get("t") is reg.get("t") and sys.modules[site_module].IMPORTS == [1]


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("no_such_module_xyz:thing", "thing 'x': cannot import 'no_such_module_xyz' (ModuleNotFoundError"),
        ("{mod}:missing", "thing 'x': module '{mod}' has no attribute 'missing'"),
        ("{mod}", "thing 'x': '{mod}' is not 'module:attribute'"),
        ("{mod}:NOT_CALLABLE", "thing 'x': {mod}:NOT_CALLABLE is not callable"),
    ],
)
def test_a_bad_target_is_a_config_error_naming_the_entry(site_module: str, target: str, words: str) -> None:
    def must_call(obj: object) -> None:
        if not callable(obj):
            raise TypeError("is not callable")

    reg: Registry[Any] = Registry("thing", {"x": target.format(mod=site_module)}, validate=must_call)
    with pytest.raises(ConfigError) as err:
        reg.get("x")
    assert words.format(mod=site_module) in str(err.value)


def test_a_module_that_raises_on_import_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "site_broken_xyz.py").write_text("raise RuntimeError('no BMC library')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"cannot import 'site_broken_xyz' \(RuntimeError: no BMC library\)"):
        import_target("site_broken_xyz:anything")
    sys.modules.pop("site_broken_xyz", None)


def test_extended_adds_entries_without_changing_the_original(site_module: str) -> None:
    base: Registry[Any] = Registry("provider", {"reboot": "x:y"})
    site = base.extended({"ipmi": f"{site_module}:thing"})
    assert site.names() == ["ipmi", "reboot"] and base.names() == ["reboot"]
    assert site.get("ipmi")() == "made"


def test_entry_points_of_installed_packages_are_known(tmp_path: Path) -> None:
    """A package declaring `[project.entry-points."hpresilience.providers"]` is found without importing it first."""
    dist = tmp_path / "sitepkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sitepkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[hpresilience.providers]\nipmi = sitepkg_ipmi:make\n")
    (tmp_path / "sitepkg_ipmi.py").write_text("def make(options, context):\n    return 'ipmi provider'\n")
    code = (
        "from hpresilience.registry import Registry\n"
        "r = Registry('provider', {'reboot': 'x:y'}, entry_point_group='hpresilience.providers')\n"
        "print(r.names(), r.get('ipmi')(None, None))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == "['ipmi', 'reboot'] ipmi provider", out.stderr


def test_every_extension_point_uses_the_one_registry() -> None:
    """Issue 11: four registry styles (decorator, string table, dict, string map) became one."""
    from hpresilience.cli import LAZY_COMMANDS
    from hpresilience.controller.gates import GATES
    from hpresilience.controller.providers import PROVIDERS
    from hpresilience.health.checks import CHECKS

    for reg, kind in [(CHECKS, "check"), (PROVIDERS, "provider"), (GATES, "gate"), (LAZY_COMMANDS, "command")]:
        assert isinstance(reg, Registry) and reg.kind == kind
    assert {"gpu.count", "xid"} <= set(CHECKS.names())
    assert {"reboot", "script", "ec2", "hyperpod"} <= set(PROVIDERS.names())
    assert GATES.names() == ["command", "none", "slurm"]


def test_health_base_does_not_import_the_checks_it_registers() -> None:
    """The checks build on health/base.py; base importing them back made a cycle inside the package."""
    code = (
        "import sys, hpresilience.health.base as b\nprint('hpresilience.health.checks' in sys.modules, len(b.CHECKS))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False 0", out.stderr
