"""`script`: a site command (IPMI power-cycle, Warewulf/xCAT re-imaging, ...) run as `COMMAND... NODE ACTION`.

The command gets the Slurm node name and "reboot" or "replace" as its last two arguments (or wherever
`{node}` / `{action}` / `{address}` appear in it), runs under a timeout that kills its whole process group,
and its output is logged (tail only: a chatty imaging tool must not flood the journal).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from hpresilience.controller.providers import ProviderContext
from hpresilience.controller.templates import render, run_site_command, template_problem
from hpresilience.errors import ExternalError
from hpresilience.log import get_logger
from hpresilience.reasons import Action
from hpresilience.settings_base import Section, reference_error
from hpresilience.slurm.models import Node

log = get_logger("hpresilience.controller")
SCRIPT_KEYS = ("node", "action", "address", "hostname")


class ScriptOptions(Section):
    command: list[str] = Field(min_length=1)
    timeout_s: float = Field(default=600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("command")
    @classmethod
    def _template(cls, command: list[str]) -> list[str]:
        problem = template_problem(command, SCRIPT_KEYS)
        if problem:
            raise reference_error(problem)
        return command


class ScriptProvider:
    name = "script"
    Options: ClassVar[type[ScriptOptions]] = ScriptOptions

    def __init__(self, options: ScriptOptions, context: ProviderContext) -> None:
        self.options = options
        self.group = context.group

    def act(self, node: Node, action: Action) -> str:
        argv = render(
            self.options.command,
            {"node": node.name, "action": action.value, "address": node.address, "hostname": node.hostname},
        )
        rc, out = run_site_command(argv, self.options.timeout_s, self.options.env)
        log.info(
            "provider_script_finished",
            node=node.name,
            action=action.value,
            argv=argv,
            exit_code=rc,
            output=out.strip()[-1000:],
        )
        if rc != 0:
            last = out.strip().splitlines()[-1] if out.strip() else "no output"
            raise ExternalError(f"`{' '.join(argv)}` exited {rc}: {last}")
        return f"`{' '.join(argv)}` exited 0"
