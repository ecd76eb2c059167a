"""What may be installed (an explicit wheel or a pinned VCS URL, never a bare name), on which Python, and
the lifecycle script's refusals. None of these get as far as building a venv."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpresilience.errors import ConfigError, EnvironmentMissing
from hpresilience.install.venv import check_python, check_source
from tests.install.conftest import REPO, hpr_install


@pytest.mark.parametrize("spec", ["hpresilience", "hpresilience==0.1.0", "./missing.whl"])
def test_a_bare_name_or_missing_file_is_refused(tmp_path: Path, spec: str) -> None:
    """`pip install hpresilience` as root would install whoever claims the name on the index."""
    res = hpr_install("--role", "compute", "--root", str(tmp_path / "r"), "--wheel", spec)
    assert res.returncode == 2 and "not claimed" in res.stderr
    assert not (tmp_path / "r").exists()


def test_a_vcs_url_must_be_pinned_to_a_commit() -> None:
    with pytest.raises(ConfigError, match="pinned to a full commit"):
        check_source(None, "git+https://github.com/example/hpresilience@main")
    pinned = "git+https://github.com/example/hpresilience@" + "0123456789abcdef" * 2 + "01234567"
    assert check_source(None, pinned) == pinned


def test_no_source_and_no_venv_is_a_usage_error(tmp_path: Path) -> None:
    res = hpr_install("--role", "login", "--root", str(tmp_path / "r"))
    assert res.returncode == 2 and "give --wheel FILE" in res.stderr


def fake_python(tmp_path: Path, version: str) -> Path:
    p = tmp_path / "python3"
    p.write_text(f"#!/bin/sh\necho {version}\n")
    p.chmod(0o755)
    return p


def test_an_older_python_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """Ubuntu 22.04's python3 is 3.10: the install says so before building anything."""
    with pytest.raises(EnvironmentMissing, match=r"Python 3\.10\.12; hpresilience needs Python >= 3\.11"):
        check_python(str(fake_python(tmp_path, "3.10.12")))
    check_python(str(fake_python(tmp_path, "3.11.2")))


def test_install_with_an_old_python_exits_3_and_builds_nothing(tmp_path: Path) -> None:
    whl = tmp_path / "hpresilience-0.0.0-py3-none-any.whl"
    whl.write_bytes(b"not used")
    res = hpr_install(
        "--role",
        "compute",
        "--root",
        str(tmp_path / "r"),
        "--wheel",
        str(whl),
        "--python",
        str(fake_python(tmp_path, "3.10.12")),
    )
    assert res.returncode == 3 and "needs Python >= 3.11" in res.stderr
    assert not (tmp_path / "r" / "opt" / "hpresilience" / "venv").exists()


def test_on_create_without_a_wheel_refuses_the_index(tmp_path: Path) -> None:
    """The lifecycle script never falls back to `pip install hpresilience`."""
    script = tmp_path / "on_create.sh"
    script.write_text((REPO / "lifecycle_scripts" / "on_create.sh").read_text())
    res = subprocess.run(["bash", str(script), "compute"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "give --wheel FILE" in res.stderr and "refused" in res.stderr


def test_on_create_rejects_unknown_arguments() -> None:
    res = subprocess.run(
        ["bash", str(REPO / "lifecycle_scripts" / "on_create.sh"), "compute", "--bogus"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2 and "unknown argument --bogus" in res.stderr


def test_the_installer_and_on_create_install_the_node_extra(tmp_path: Path) -> None:
    """The base package is the training library's small set; the node side comes with `[node]`."""
    from hpresilience.install.venv import with_node_extra

    whl = tmp_path / "hpresilience-0.1.0-py3-none-any.whl"
    whl.write_bytes(b"")
    assert with_node_extra(str(whl)) == f"{whl}[node]"
    url = "git+https://example.org/hpr@" + "a" * 40
    assert with_node_extra(url) == f"hpresilience[node] @ {url}"
    assert 'req="$wheel[node]"' in (REPO / "lifecycle_scripts" / "on_create.sh").read_text()
