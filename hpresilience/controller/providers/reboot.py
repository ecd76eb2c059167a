"""`reboot`: Slurm's own `scontrol reboot ASAP`, which works on any cluster with a RebootProgram.

Replacing needs hardware Slurm cannot conjure, so a "replace" here is a reboot too, said so in the result.
The reason we pass is ours (not Slurm's "Reboot ASAP"), so after the reboot slurmctld keeps the DRAIN we
set before acting and the node waits for the health gate instead of going straight back into service.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from hpresilience.controller.providers import ProviderContext
from hpresilience.reasons import Action, controller_reason
from hpresilience.settings_base import Section
from hpresilience.slurm.models import Node


class RebootOptions(Section):
    asap: bool = True
    nextstate: Literal["resume", "down"] = "resume"


class RebootProvider:
    name = "reboot"
    Options: ClassVar[type[RebootOptions]] = RebootOptions

    def __init__(self, options: RebootOptions, context: ProviderContext) -> None:
        self.options = options
        self.client = context.client

    def act(self, node: Node, action: Action) -> str:
        self.client.reboot_nodes(
            [node.name],
            controller_reason(f"repair: {action} by scontrol reboot"),
            asap=self.options.asap,
            nextstate=self.options.nextstate,
        )
        extra = "" if action is Action.REBOOT else " (this provider cannot replace hardware: rebooted instead)"
        return f"scontrol reboot {'ASAP ' if self.options.asap else ''}nextstate={self.options.nextstate}{extra}"
