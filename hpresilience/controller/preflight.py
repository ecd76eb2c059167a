"""What the controller checks once at start: that each provider and the gate can work on this cluster.

Without these a wrong set-up shows only at the first repair, as provider errors or failed gates that climb the
ladder until the node is given up. So the daemon refuses to start (exit 2, which its unit does not restart)
with one line naming everything that is missing:
- `reboot` provider: slurmctld has a RebootProgram (read from the running slurmctld, not from a file);
- `script` provider: its command is an executable file;
- `slurm` gate: srun is here, and this user may create reservations (root, SlurmUser, or AdminLevel
  Operator/Administrator);
- `command` gate: its command (ssh by default) is an executable file.
"""

from __future__ import annotations

import getpass
import os
import shutil
from collections.abc import Iterator
from typing import Any

from hpresilience.controller.settings import ControllerSettings
from hpresilience.slurm import reservations
from hpresilience.slurm.client import SlurmClient


def provider_uses(settings: ControllerSettings) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, provider name, options) for the default and for each node group."""
    yield "default_provider", settings.default_provider, settings.default_options
    for i, g in enumerate(settings.groups):
        yield f"groups[{i}] ({g.name})", g.provider, g.options


def executable_problem(command: object) -> str | None:
    if not isinstance(command, list) or not command or not isinstance(command[0], str):
        return None  # the options' own validation names a malformed command
    tool = command[0]
    found = tool if os.sep in tool else shutil.which(tool)
    if found and os.path.isfile(found) and os.access(found, os.X_OK):
        return None
    return f"{tool} is not an executable file" + ("" if os.sep in tool else " on PATH")


def preflight(
    settings: ControllerSettings, client: SlurmClient, user: str | None = None, uid: int | None = None
) -> list[str]:
    """Everything missing for the configured providers and gate, one phrase each ([] when all is there)."""
    config = client.config()
    problems: list[str] = []
    reboot_users = [where for where, name, _ in provider_uses(settings) if name == "reboot"]
    if reboot_users and not reservations.reboot_program(config):
        problems.append(
            f"provider reboot ({', '.join(reboot_users)}) needs RebootProgram in slurm.conf and the "
            "running slurmctld has none (add RebootProgram=/sbin/reboot, then scontrol reconfigure)"
        )
    for where, name, options in provider_uses(settings):
        if name == "script":
            problem = executable_problem(options.get("command"))
            if problem:
                problems.append(f"provider script ({where}): {problem}")
    gate = settings.gate
    if gate.kind == "slurm":
        srun = executable_problem([reservations.tool_path(client, "srun")])
        if srun:
            problems.append(f"gate slurm runs its job with srun: {srun} (this host must be a Slurm submit host)")
        who = user or _user()
        problem = reservations.reservation_rights_problem(client, who, os.getuid() if uid is None else uid, config)
        if problem:
            problems.append(f"gate slurm needs to create maintenance reservations: {problem}")
    elif gate.kind == "command":
        problem = executable_problem(gate.command)
        if problem:
            problems.append(f"gate command: {problem}")
    return problems


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
