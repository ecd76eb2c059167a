"""The install's first half: what to install (never a bare name from an index) and the venv it goes into.

The package name `hpresilience` is not claimed on PyPI: `pip install hpresilience` as root on every
node would install whatever someone registers under it. So the source is an explicit wheel or sdist
file, or a VCS URL pinned to a full commit hash; a bare requirement is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from hpresilience import proc
from hpresilience.errors import ConfigError, EnvironmentMissing, ExternalError
from hpresilience.install.layout import MIN_PYTHON, Layout
from hpresilience.log import get_logger

log = get_logger("hpresilience.install")
PIP_TIMEOUT_S = 1800.0
_PINNED_VCS = re.compile(r"^(git|hg)\+(https|ssh|file)://\S+@[0-9a-f]{40}(#\S*)?$")


def check_source(wheel: str | None, source: str | None) -> str | None:
    """The pip requirement to install, or None to keep the venv's package; ConfigError for an unsafe one."""
    if wheel and source:
        raise ConfigError("give --wheel or --source, not both")
    if wheel:
        p = Path(wheel)
        if not p.is_file() or not (p.name.endswith(".whl") or p.name.endswith(".tar.gz")):
            raise ConfigError(
                f"--wheel {wheel!r} is not a wheel (.whl) or sdist (.tar.gz) file; installing a bare "
                "name from a package index is refused (the name 'hpresilience' is not claimed there)"
            )
        return str(p.resolve())
    if source:
        if not _PINNED_VCS.match(source):
            raise ConfigError(
                f"--source {source!r} is not a VCS URL pinned to a full commit "
                "(git+https://HOST/REPO@<40-hex commit>); use --wheel FILE for a built package"
            )
        return source
    return None


def with_node_extra(requirement: str) -> str:
    """The requirement with the node side's dependencies (the `node` extra): a file as `FILE[node]`, a
    pinned URL as `hpresilience[node] @ URL`."""
    if Path(requirement).is_file():
        return f"{requirement}[node]"
    return f"hpresilience[node] @ {requirement}"


def source_digest(requirement: str) -> str:
    """sha256 of a wheel/sdist file's bytes, or of a pinned URL (the commit is in it)."""
    p = Path(requirement)
    h = hashlib.sha256()
    if p.is_file():
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    else:
        h.update(requirement.encode())
    return h.hexdigest()


def check_python(python: str) -> None:
    """The interpreter the venv is built from must be at least MIN_PYTHON (Ubuntu 22.04's python3 is 3.10)."""
    r = proc.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"], timeout=60)
    if not r.ok:
        raise EnvironmentMissing(f"cannot run {python!r} to build the venv: {r.describe()}")
    version = r.stdout.strip()
    parts = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
    if parts < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        raise EnvironmentMissing(
            f"{python} is Python {version}; hpresilience needs Python >= {need} "
            f"(install python{need} and pass --python /usr/bin/python{need})"
        )


def running_in(layout: Layout) -> bool:
    """Is this process the target venv's interpreter (the lifecycle script's bootstrap)?"""
    try:
        return Path(sys.prefix).resolve() == layout.venv.resolve()
    except OSError:
        return False


def read_manifest(layout: Layout) -> dict[str, object]:
    try:
        data = json.loads(layout.manifest.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# A manifest is written by us but read back from disk: each entry is taken in the shape it should have,
# and one of another shape (an edited or older file) reads as empty.
def manifest_list(data: dict[str, object], key: str) -> list[str]:
    value = data.get(key)
    return [str(v) for v in value] if isinstance(value, list) else []


def manifest_map(data: dict[str, object], key: str) -> dict[str, str]:
    value = data.get(key)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def manifest_lists(data: dict[str, object], key: str) -> dict[str, list[str]]:
    value = data.get(key)
    if not isinstance(value, dict):
        return {}
    return {str(k): [str(p) for p in v] for k, v in value.items() if isinstance(v, list)}


def _pip(layout: Layout, *args: str) -> None:
    r = proc.run(
        [str(layout.venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
        timeout=PIP_TIMEOUT_S,
    )
    if not r.ok:
        raise ExternalError(f"installing into {layout.venv} failed: {r.describe()}")


def ensure_venv(layout: Layout, requirement: str | None, python: str) -> bool:
    """Create the venv and install `requirement` into it when it is not what the venv already holds.
    Returns True when the venv's package changed (the daemons using it must be restarted)."""
    exe = layout.venv / "bin" / "hpresilience"
    if requirement is None:
        if not exe.exists():
            raise ConfigError(
                f"{layout.venv} holds no hpresilience: give --wheel FILE (a built wheel or sdist) "
                "or --source git+https://HOST/REPO@COMMIT"
            )
        return False
    digest = source_digest(requirement)
    if exe.exists() and read_manifest(layout).get("source_sha256") == digest:
        log.info("package_unchanged", venv=str(layout.venv), source=requirement)
        return False
    if not (layout.venv / "bin" / "python").exists():
        check_python(python)
        layout.venv.parent.mkdir(parents=True, exist_ok=True)
        r = proc.run([python, "-m", "venv", str(layout.venv)], timeout=300)
        if not r.ok:
            raise ExternalError(f"creating the venv {layout.venv} failed: {r.describe()}")
        log.info("venv_created", venv=str(layout.venv), python=python)
    _pip(layout, with_node_extra(requirement))
    # Same version, new build (a rebuilt wheel): pip would keep the old files without this.
    _pip(layout, "--force-reinstall", "--no-deps", requirement)
    log.info("package_installed", venv=str(layout.venv), source=requirement, sha256=digest)
    return True
