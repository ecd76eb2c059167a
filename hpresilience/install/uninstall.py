"""`hpresilience uninstall --role R`: remove what `install --role R` laid out, as its manifest lists it.

The manifest (`<prefix>/install-manifest.json`) records every file and link each role wrote, with the file's
sha256. A path another installed role also uses stays; a file changed since install (an edited config.yaml)
stays, and the report says so; the role's units are stopped and disabled first. When the last role goes,
the manifest goes too; the venv and the state directories (/var/lib/hpresilience: repair records, events)
are left for the admin to remove, and the report names them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hpresilience import proc
from hpresilience.errors import ConfigError, ExternalError
from hpresilience.fileio import atomic_write_text
from hpresilience.install.layout import Layout, Role
from hpresilience.install.venv import manifest_list, manifest_lists, manifest_map, read_manifest
from hpresilience.log import get_logger

log = get_logger("hpresilience.install")


@dataclass
class UninstallReport:
    role: Role
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # "path (why)"
    systemd: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # what the admin may remove by hand


def uninstall(layout: Layout, role: Role, use_systemd: bool) -> UninstallReport:
    data = read_manifest(layout)
    roles = manifest_list(data, "roles")
    if role not in roles:
        raise ConfigError(
            f"role {role} is not installed under {layout.root} (manifest {layout.manifest} lists "
            f"{', '.join(roles) or 'no role'})"
        )
    role_files = manifest_lists(data, "role_files")
    files, links = manifest_map(data, "files"), manifest_map(data, "links")
    # A manifest from before role_files: its paths are this role's only when it is the only role.
    mine = role_files.get(role, sorted({*files, *links}) if roles == [role] else [])
    others = {p for r, ps in role_files.items() if r != role for p in ps}
    report = UninstallReport(role)
    units = layout.units(role)
    for unit in units:
        argv = ["systemctl", "disable", "--now", unit]
        if use_systemd:
            r = proc.run(argv, timeout=120)
            if not r.ok:
                raise ExternalError(f"{r.describe()} (nothing was removed)")
        report.systemd.append(" ".join(argv))
    for path in mine:
        if path in others:
            report.kept.append(f"{path} (used by another installed role)")
            continue
        report_removal(Path(path), files.get(path), links.get(path), report)
    if units:
        report.systemd.append("systemctl daemon-reload")
        if use_systemd:
            proc.run(["systemctl", "daemon-reload"], timeout=120)
    left = [r for r in roles if r != role]
    if left:
        gone = set(report.removed)
        data.update(
            {
                "roles": left,
                "role_files": {r: ps for r, ps in role_files.items() if r != role},
                "files": {p: h for p, h in files.items() if p not in gone},
                "links": {p: t for p, t in links.items() if p not in gone},
            }
        )
        atomic_write_text(layout.manifest, json.dumps(data, indent=2, sort_keys=True) + "\n")
    else:
        layout.manifest.unlink(missing_ok=True)
        report.removed.append(str(layout.manifest))
        report.left += [str(p) for p in (layout.venv, layout.at("/var/lib/hpresilience")) if p.exists()]
    log.info("uninstall_finished", role=role, root=str(layout.root), removed=len(report.removed), kept=len(report.kept))
    return report


def report_removal(p: Path, sha: str | None, target: str | None, report: UninstallReport) -> None:
    """Remove one path laid out by install, unless it changed since (then keep it and say why)."""
    if p.is_symlink():
        if target is not None and os.readlink(p) != target:
            report.kept.append(f"{p} (a link to {os.readlink(p)} now, not what install made)")
            return
        p.unlink()
    elif p.is_file():
        if sha is not None and hashlib.sha256(p.read_bytes()).hexdigest() != sha:
            report.kept.append(f"{p} (changed since install)")
            return
        p.unlink()
    else:
        return
    report.removed.append(str(p))
    log.info("uninstall_file_removed", path=str(p))
