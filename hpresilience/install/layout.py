"""Where `hpresilience install` puts things, and the files it renders from the package data.

Every path lives under `root` (default `/`), and the files refer to each other by their real
location under that root: a tree installed with `--root /tmp/x` works in place (its unit's ExecStart,
its healthcheck.sh and its PATH entry name /tmp/x/...), which is what lets tests run what they install.
The templates ship inside the wheel (hpresilience/install/data) and are read with importlib.resources,
so the installer lays out the files of the package it runs from.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from hpresilience.errors import ConfigError
from hpresilience.health.base import Mode

Role = Literal["compute", "controller", "login"]
ROLES: tuple[Role, ...] = ("compute", "controller", "login")


def as_role(name: str) -> Role:
    """A role's name (from a command line that offered ROLES) as a Role."""
    for role in ROLES:
        if role == name:
            return role
    raise ConfigError(f"unknown role {name!r} (known: {', '.join(ROLES)})")


# The lowest Python the package runs on; pyproject.toml's requires-python says the same (a test holds them).
MIN_PYTHON = (3, 11)

AGENT_UNIT = "hpresilience-agent.service"
CONTROLLER_UNIT = "hpresilience-controller.service"
# Huge pages for /dev/shm, where the checkpoint memory tier lives: its restore's speed (the unit says why).
SHM_UNIT = "hpresilience-shm-hugepages.service"


@dataclass(frozen=True)
class Layout:
    root: Path
    prefix: str = "/opt/hpresilience"

    def at(self, path: str) -> Path:
        """`path` (absolute, as on the target) under the install root."""
        return self.root / path.lstrip("/")

    @property
    def base(self) -> Path:
        return self.at(self.prefix)

    @property
    def venv(self) -> Path:
        return self.base / "venv"

    @property
    def bin_dir(self) -> Path:
        """What goes on users' PATH: the `hpresilience` CLI and the srun shim, nothing else of the venv."""
        return self.base / "bin"

    @property
    def etc(self) -> Path:
        return self.at("/etc/hpresilience")

    @property
    def config(self) -> Path:
        return self.etc / "config.yaml"

    @property
    def manifest(self) -> Path:
        return self.base / "install-manifest.json"

    @property
    def profile_d(self) -> Path:
        return self.at("/etc/profile.d/hpresilience.sh")

    @property
    def unit_dir(self) -> Path:
        return self.at("/etc/systemd/system")

    @property
    def healthcheck(self) -> Path:
        return self.base / "slurm" / "healthcheck.sh"

    @property
    def epilog(self) -> Path:
        """Slurm Epilog: removes the checkpoint memory tier a crashed job left on the node."""
        return self.base / "slurm" / "epilog.sh"

    @property
    def snippet(self) -> Path:
        return self.base / "slurm" / "slurm.conf.hpresilience"

    def state_dir(self, part: str) -> Path:
        return self.at(f"/var/lib/hpresilience/{part}")

    def units(self, role: Role) -> list[str]:
        return {"compute": [AGENT_UNIT, SHM_UNIT], "controller": [CONTROLLER_UNIT], "login": []}[role]


def template(name: str) -> str:
    return resources.files("hpresilience.install").joinpath("data", name).read_text()


def render(name: str, layout: Layout) -> str:
    """A data file with its @VENV@ / @CONFIG@ / @PREFIX@ placeholders filled for this layout."""
    text = template(name)
    for key, value in (("@VENV@", layout.venv), ("@CONFIG@", layout.config), ("@PREFIX@", layout.base)):
        text = text.replace(key, str(value))
    return text


def profile_script(layout: Layout) -> str:
    """/etc/profile.d entry: the prefix's bin first on PATH (the shim must come before Slurm's srun), once."""
    d = layout.bin_dir
    return (
        "# hpresilience: the `hpresilience` CLI and the srun shim (srun --auto-resume=1) for every login shell.\n"
        f'case ":$PATH:" in\n  *":{d}:"*) ;;\n  *) PATH="{d}:$PATH"; export PATH ;;\nesac\n'
    )


def default_config(layout: Layout, mode: Mode = Mode.OBSERVE) -> str:
    """The config written when none is given: defaults, with the state directories under the install root, and
    the agent observing (a new site) unless install was given --enforce."""
    return (
        "# hpresilience configuration (docs/configuration.md). Written by `hpresilience install`;\n"
        "# your edits are kept: install never overwrites this file unless given --config.\n"
        "# agent.mode observe: the agent logs and counts what it would do and never touches Slurm; watch\n"
        '# hpr_agent_decisions_total{decision="would_mark"}, then set enforce (docs/rollout.md).\n'
        f"agent:\n  mode: {mode.value}\n  state_dir: {layout.state_dir('agent')}\n"
        f"health:\n  state_dir: {layout.state_dir('health')}\n"
        f"controller:\n  state_dir: {layout.state_dir('controller')}\n"
    )
