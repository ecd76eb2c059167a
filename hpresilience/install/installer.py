"""The install's second half: lay out the files of one role, enable its units, print the slurm.conf lines.

Runs from the target venv's own package (the first half re-runs the command there), so every file comes
from the wheel just installed. Idempotent: a file is rewritten only when its content differs, and a
daemon is restarted only when something it uses (its unit, the package, the config) was replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hpresilience import __version__, proc
from hpresilience.config import Config, load_config
from hpresilience.controller.preflight import provider_uses
from hpresilience.errors import ExternalError
from hpresilience.fileio import atomic_write_text
from hpresilience.health.base import Mode
from hpresilience.install.layout import Layout, Role, default_config, profile_script, render, template
from hpresilience.install.venv import manifest_list, manifest_lists, manifest_map, read_manifest
from hpresilience.log import get_logger
from hpresilience.slurm.conf import merge_lines, parse_settings

log = get_logger("hpresilience.install")
SLURM_CONF_CANDIDATES = ("/etc/slurm/slurm.conf", "/opt/slurm/etc/slurm.conf", "/etc/slurm-llnl/slurm.conf")


@dataclass
class Report:
    role: Role
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    systemd: list[str] = field(default_factory=list)
    slurm_lines: list[str] = field(default_factory=list)
    slurm_conf: str | None = None
    agent_mode: str = ""
    notes: list[str] = field(default_factory=list)


def install_file(path: Path, text: str, mode: int, report: Report) -> bool:
    """Write `text` to `path` with `mode` unless it is already there; True when written."""
    try:
        same = path.read_text() == text and (path.stat().st_mode & 0o777) == mode
    except (OSError, UnicodeDecodeError):
        same = False
    if same:
        report.unchanged.append(str(path))
        log.debug("install_file_unchanged", path=str(path))
        return False
    atomic_write_text(path, text, fsync=True, mode=mode)
    report.written.append(str(path))
    log.info("install_file_written", path=str(path), mode=oct(mode))
    return True


def install_link(link: Path, target: Path, report: Report) -> bool:
    if link.is_symlink() and os.readlink(link) == str(target):
        report.unchanged.append(str(link))
        return False
    link.parent.mkdir(parents=True, exist_ok=True)
    # A link, not a file's contents: fileio's atomic write does not apply; link then rename is the same idea.
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)
    report.written.append(str(link))
    log.info("install_link_written", path=str(link), target=str(target))
    return True


def install_config(layout: Layout, config: str | None, report: Report, enforce: bool = False) -> bool:
    """The given config, validated before it lands; else keep a valid one in place; else the defaults, with the
    agent in observe mode unless `enforce` (a new site watches what the agent would do before it acts)."""
    if config is not None:
        cfg = load_config(config)  # ConfigError names the file and key; nothing is written
        report.agent_mode = cfg.agent.mode.value
        if "mode" not in cfg.agent.model_fields_set and not enforce:
            report.notes.append(
                f"{config} does not set agent.mode: the agent enforces (marks nodes) from the start; "
                "a new site sets `agent: {mode: observe}` first (docs/rollout.md)"
            )
        return install_file(layout.config, Path(config).read_text(), 0o644, report)
    if layout.config.exists():
        cfg = load_config(layout.config)  # a bad file in place would make the units fail on start
        report.agent_mode = cfg.agent.mode.value
        if enforce and cfg.agent.mode is not Mode.ENFORCE:
            report.notes.append(
                f"--enforce applies to a new site; {layout.config} is kept and says agent.mode "
                f"{cfg.agent.mode.value}: edit it to enforce (docs/rollout.md)"
            )
        report.unchanged.append(str(layout.config))
        return False
    report.agent_mode = (Mode.ENFORCE if enforce else Mode.OBSERVE).value
    text = default_config(layout, Mode.ENFORCE if enforce else Mode.OBSERVE)
    return install_file(layout.config, text, 0o644, report)


def systemd_plan(
    units: list[str], changed_units: set[str], package_changed: bool, config_changed: bool, active: set[str]
) -> list[list[str]]:
    """systemctl commands: reload when a unit file changed, enable and start every unit, and restart a
    running one whose unit file, package or config was replaced (the running process still has the old)."""
    plan: list[list[str]] = []
    if changed_units:
        plan.append(["systemctl", "daemon-reload"])
    for u in units:
        plan.append(["systemctl", "enable", "--now", u])
        if u in active and (u in changed_units or package_changed or config_changed):
            plan.append(["systemctl", "restart", u])
    return plan


def _active_units(units: list[str]) -> set[str]:
    return {u for u in units if proc.run(["systemctl", "is-active", "--quiet", u], timeout=30).ok}


def provider_lines(config: Config, existing: str | None) -> str:
    """slurm.conf lines the configured providers need (slurm.conf is the cluster's one file, so every role
    prints them): `reboot` runs `scontrol reboot`, which fails on every node without a RebootProgram. A site's
    own RebootProgram is kept (any program will do)."""
    have = {s.key.lower() for s in parse_settings(existing or "")}
    if "rebootprogram" not in have and any(name == "reboot" for _, name, _ in provider_uses(config.controller)):
        return (
            "\n# The controller's `reboot` provider (its default) runs `scontrol reboot`, which fails on every\n"
            "# node without one; the controller refuses to start until the running slurmctld has one.\n"
            "RebootProgram=/sbin/reboot\n"
        )
    return ""


def find_slurm_conf(layout: Layout, explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    return next((layout.at(c) for c in SLURM_CONF_CANDIDATES if layout.at(c).is_file()), None)


def lay_out(
    layout: Layout,
    role: Role,
    *,
    config: str | None,
    package_changed: bool,
    use_systemd: bool,
    slurm_conf: str | None,
    enforce: bool = False,
) -> Report:
    report = Report(role)
    config_changed = install_config(layout, config, report, enforce)
    install_link(layout.bin_dir / "hpresilience", layout.venv / "bin" / "hpresilience", report)
    install_file(layout.profile_d, profile_script(layout), 0o644, report)
    conf = find_slurm_conf(layout, slurm_conf)
    existing = conf.read_text() if conf and conf.is_file() else None
    snippet = render("slurm.conf.hpresilience", layout) + provider_lines(load_config(layout.config), existing)
    install_file(layout.snippet, snippet, 0o644, report)
    if role in ("compute", "login"):
        install_file(layout.bin_dir / "srun", template("srun"), 0o755, report)
    changed_units: set[str] = set()
    if role == "compute":
        install_file(layout.healthcheck, render("healthcheck.sh", layout), 0o755, report)
        install_file(layout.epilog, render("epilog.sh", layout), 0o755, report)
    for unit in layout.units(role):
        if install_file(layout.unit_dir / unit, render(unit, layout), 0o644, report):
            changed_units.add(unit)
    for part in {"compute": ("agent", "health"), "controller": ("controller",), "login": ()}[role]:
        layout.state_dir(part).mkdir(parents=True, exist_ok=True, mode=0o700)
    units = layout.units(role)
    if units:
        plan = systemd_plan(
            units, changed_units, package_changed, config_changed, _active_units(units) if use_systemd else set()
        )
        for argv in plan:
            if use_systemd:
                r = proc.run(argv, timeout=120)
                if not r.ok:
                    raise ExternalError(f"{r.describe()} (the files are installed; see journalctl -u {units[0]})")
                log.info("systemctl_ran", argv=argv)
            report.systemd.append(" ".join(argv))
    report.slurm_conf = str(conf) if conf else None
    report.slurm_lines = merge_lines(snippet, existing)
    write_manifest(layout, role, report)
    log.info(
        "install_finished",
        role=role,
        root=str(layout.root),
        written=len(report.written),
        unchanged=len(report.unchanged),
    )
    return report


def write_manifest(layout: Layout, role: Role, report: Report) -> None:
    data = read_manifest(layout)
    roles = sorted({*manifest_list(data, "roles"), role})
    files = {
        p: hashlib.sha256(Path(p).read_bytes()).hexdigest()
        for p in report.written + report.unchanged
        if Path(p).is_file() and not Path(p).is_symlink()
    }
    links = {p: os.readlink(p) for p in report.written + report.unchanged if Path(p).is_symlink()}
    # Which role laid out which path: `uninstall --role R` removes only what no other installed role uses.
    role_files = manifest_lists(data, "role_files")
    role_files[role] = sorted(set(report.written + report.unchanged))
    data.update(
        {
            "version": __version__,
            "roles": roles,
            "prefix": layout.prefix,
            "root": str(layout.root),
            "files": {**manifest_map(data, "files"), **files},
            "links": {**manifest_map(data, "links"), **links},
            "role_files": role_files,
        }
    )
    atomic_write_text(layout.manifest, json.dumps(data, indent=2, sort_keys=True) + "\n")


def record_source(layout: Layout, digest: str) -> None:
    data = read_manifest(layout)
    data["source_sha256"] = digest
    atomic_write_text(layout.manifest, json.dumps(data, indent=2, sort_keys=True) + "\n")
