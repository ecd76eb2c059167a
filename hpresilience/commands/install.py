"""`hpresilience install --role compute|controller|login|auto`: one node's whole install, in one step."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hpresilience import proc
from hpresilience.commands.context import Ctx, pass_ctx
from hpresilience.config import load_config
from hpresilience.errors import ExternalError
from hpresilience.install.hyperpod import RESOURCE_CONFIG, detect_role
from hpresilience.install.layout import ROLES, Layout, Role, as_role
from hpresilience.install.venv import check_source, ensure_venv, running_in, source_digest
from hpresilience.log import setup_logging


@click.command("install")
@click.option(
    "--role",
    required=True,
    type=click.Choice([*ROLES, "auto"]),
    help="compute: agent, healthcheck.sh, srun shim; controller: the repair daemon; login: CLI and shim. "
    "auto: from the HyperPod resource config.",
)
@click.option("--wheel", help="Wheel or sdist FILE to install (never a bare name from an index).")
@click.option("--source", help="Or a VCS URL pinned to a commit: git+https://HOST/REPO@<40-hex commit>.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="Configuration to install, validated first (default: keep the one in place, else the defaults).",
)
@click.option(
    "--root",
    default="/",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Install under this directory (a throwaway root, an image being built).",
)
@click.option("--prefix", default="/opt/hpresilience", show_default=True, help="Where the venv and scripts go.")
@click.option("--python", "python", default="python3", show_default=True, help="Interpreter for the venv (>= 3.11).")
@click.option(
    "--slurm-conf",
    type=click.Path(dir_okay=False),
    help="slurm.conf to merge against (default: ROOT/etc/slurm/slurm.conf or /opt/slurm/etc/slurm.conf).",
)
@click.option("--resource-config", default=RESOURCE_CONFIG, show_default=True, help="For --role auto.")
@click.option(
    "--provisioning-parameters",
    type=click.Path(dir_okay=False),
    help="For --role auto: names controller_group and login_group (default: beside the resource config).",
)
@click.option(
    "--systemd/--no-systemd",
    "use_systemd",
    default=None,
    help="Enable and (re)start the units (default: when ROOT is / and systemd runs).",
)
@click.option(
    "--enforce",
    is_flag=True,
    help="A new site's agent marks nodes from the start (default: agent.mode observe; docs/rollout.md).",
)
@click.option("--layout-only", is_flag=True, hidden=True)
@click.option("--package-changed", is_flag=True, hidden=True)
@pass_ctx
def install(
    c: Ctx,
    role: str,
    wheel: str | None,
    source: str | None,
    config_file: str | None,
    root: str,
    prefix: str,
    python: str,
    slurm_conf: str | None,
    resource_config: str,
    provisioning_parameters: str | None,
    use_systemd: bool | None,
    enforce: bool,
    layout_only: bool,
    package_changed: bool,
) -> None:
    """Install hpresilience on this node for its role: venv, PATH entries, units, healthcheck.sh, config."""
    # Not c.config: the config in place is one of the things being checked, and may be broken.
    setup_logging(level="debug" if c.verbose else "info")
    layout = Layout(Path(root).resolve(), "/" + prefix.strip("/"))
    if role == "auto":
        rc = Path(resource_config)
        pp = Path(provisioning_parameters) if provisioning_parameters else rc.with_name("provisioning_parameters.json")
        role, group = detect_role(rc, pp)
        click.echo(f"role {role} (instance group {group!r} in {rc})")
    r = as_role(role)
    if use_systemd is None:
        use_systemd = str(layout.root) == "/" and Path("/run/systemd/system").is_dir()
    if layout_only:
        _lay_out(c, layout, r, config_file, package_changed, use_systemd, slurm_conf, enforce)
        return
    # Everything that can be refused is refused before anything lands.
    requirement = check_source(wheel, source)
    if config_file is not None:
        load_config(config_file)
    changed = ensure_venv(layout, requirement, python)
    if requirement is not None:
        from hpresilience.install.installer import record_source

        record_source(layout, source_digest(requirement))
    if running_in(layout) and not changed:
        _lay_out(c, layout, r, config_file, False, use_systemd, slurm_conf, enforce)
        return
    # The files come from the package just installed, so run its own installer for the rest.
    argv = [
        str(layout.venv / "bin" / "hpresilience"),
        *(["--json"] if c.json_output else []),
        "install",
        "--role",
        r,
        "--root",
        str(layout.root),
        "--prefix",
        layout.prefix,
        "--layout-only",
        "--systemd" if use_systemd else "--no-systemd",
    ]
    argv += ["--config", str(Path(config_file).resolve())] if config_file else []
    argv += ["--slurm-conf", slurm_conf] if slurm_conf else []
    argv += ["--package-changed"] if changed else []
    argv += ["--enforce"] if enforce else []
    res = proc.run(argv, timeout=600)
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    if res.timed_out:
        raise ExternalError(f"laying out the files failed: {res.describe()}")
    if res.returncode:
        # Its own error line is already on stderr; keep its exit code (2: config, 4: systemctl).
        raise click.exceptions.Exit(res.returncode)


def _lay_out(
    c: Ctx,
    layout: Layout,
    role: Role,
    config: str | None,
    package_changed: bool,
    use_systemd: bool,
    slurm_conf: str | None,
    enforce: bool = False,
) -> None:
    from hpresilience.install.installer import lay_out

    rep = lay_out(
        layout,
        role,
        config=config,
        package_changed=package_changed,
        use_systemd=use_systemd,
        slurm_conf=slurm_conf,
        enforce=enforce,
    )
    where = f"merged against {rep.slurm_conf}" if rep.slurm_conf else "no slurm.conf found to merge against"
    lines = [
        f"hpresilience {role}: {len(rep.written)} file(s) written, {len(rep.unchanged)} unchanged under {layout.root}"
    ]
    lines += [f"  wrote {p}" for p in rep.written]
    if rep.systemd:
        lines.append(("systemd: ran" if use_systemd else "systemd: not run here; on the node run") + ":")
        lines += [f"  {cmd}" for cmd in rep.systemd]
    lines.append(
        f"users: PATH gets {layout.bin_dir} from {layout.profile_d} (hpresilience CLI"
        f"{', srun shim' if role != 'controller' else ''}); new login shells have it"
    )
    if role == "compute":
        lines.append(
            f"agent mode: {rep.agent_mode}"
            + (
                " (logs and counts what it would do, touches no node; watch hpr_agent_decisions_total"
                '{decision="would_mark"}, then enforce: docs/rollout.md)'
                if rep.agent_mode == "observe"
                else ""
            )
        )
    lines += [f"note: {n}" for n in rep.notes]
    if rep.slurm_lines:
        lines.append(
            f"slurm.conf: merge these lines once into the cluster's slurm.conf ({where}), then `scontrol reconfigure`:"
        )
        lines += [f"  {ln}" for ln in rep.slurm_lines]
    else:
        lines.append(f"slurm.conf: nothing to merge ({where})")
    c.emit(
        {
            "role": role,
            "root": str(layout.root),
            "written": rep.written,
            "unchanged": rep.unchanged,
            "systemd": rep.systemd,
            "systemd_ran": use_systemd,
            "slurm_conf": rep.slurm_conf,
            "slurm_conf_lines": rep.slurm_lines,
            "agent_mode": rep.agent_mode,
            "notes": rep.notes,
        },
        "\n".join(lines),
    )


@click.command("uninstall")
@click.option("--role", required=True, type=click.Choice(list(ROLES)), help="The role to remove from this node.")
@click.option(
    "--root", default="/", show_default=True, type=click.Path(file_okay=False), help="The root it was installed under."
)
@click.option("--prefix", default="/opt/hpresilience", show_default=True, help="The prefix it was installed with.")
@click.option(
    "--systemd/--no-systemd",
    "use_systemd",
    default=None,
    help="Stop and disable the role's units (default: when ROOT is / and systemd runs).",
)
@pass_ctx
def uninstall(c: Ctx, role: str, root: str, prefix: str, use_systemd: bool | None) -> None:
    """Remove what `install --role ROLE` laid out, as install-manifest.json lists it (edited files are kept)."""
    from hpresilience.install.uninstall import uninstall as remove

    setup_logging(level="debug" if c.verbose else "info")
    layout = Layout(Path(root).resolve(), "/" + prefix.strip("/"))
    if use_systemd is None:
        use_systemd = str(layout.root) == "/" and Path("/run/systemd/system").is_dir()
    rep = remove(layout, as_role(role), use_systemd)
    lines = [f"hpresilience {role}: {len(rep.removed)} path(s) removed, {len(rep.kept)} kept under {layout.root}"]
    lines += [f"  removed {p}" for p in rep.removed] + [f"  kept {p}" for p in rep.kept]
    if rep.systemd:
        lines.append(("systemd: ran" if use_systemd else "systemd: not run here; on the node run") + ":")
        lines += [f"  {cmd}" for cmd in rep.systemd]
    if rep.left:
        lines.append(
            "left for you to remove if no longer wanted (the venv, repair records and events): " + " ".join(rep.left)
        )
    lines.append("slurm.conf: remove the lines install printed (HealthCheckProgram, ...) if no node needs them")
    c.emit(
        {
            "role": role,
            "root": str(layout.root),
            "removed": rep.removed,
            "kept": rep.kept,
            "systemd": rep.systemd,
            "systemd_ran": use_systemd,
            "left": rep.left,
        },
        "\n".join(lines),
    )
