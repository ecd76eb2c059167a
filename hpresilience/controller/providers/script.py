"""`script`: a site command (IPMI power-cycle, Warewulf/xCAT re-imaging, ...) run as `COMMAND... NODE ACTION`.

The command gets the Slurm node name and "reboot" or "replace" as its last two arguments (or wherever
`{node}` / `{action}` / `{address}` appear in it), runs under a timeout that kills its whole process group,
and its output is logged (tail only: a chatty imaging tool must not flood the journal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from typing import IO, ClassVar

from pydantic import Field

from hpresilience.controller.providers import ProviderContext
from hpresilience.errors import ExternalError
from hpresilience.log import get_logger
from hpresilience.settings_base import Section
from hpresilience.slurm.models import Node

log = get_logger("hpresilience.controller")
OUTPUT_TAIL = 2000


class ScriptOptions(Section):
    command: list[str] = Field(min_length=1)
    timeout_s: float = Field(default=600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


def check_node_value(key: str, value: str) -> str:
    """A node name, address or host name as Slurm reports it, refused if a command could read it as an
    option (`-oProxyCommand=...` ran as root through ssh) or split it (whitespace, control characters)."""
    if value.startswith("-") or any(c.isspace() or not c.isprintable() for c in value):
        raise ExternalError(f"refusing node {key} {value!r} as a command argument: it begins with '-' "
                            "or holds whitespace or control characters")
    return value


def render(template: list[str], values: Mapping[str, str]) -> list[str]:
    """Fill `{node}`-style placeholders; a template without any gets `node action` appended.

    Node-derived values (`node`, `address`, `hostname`) pass `check_node_value` first: they come from Slurm,
    where anyone who can set a NodeAddr could otherwise smuggle an option into the command.
    """
    values = {k: (check_node_value(k, v) if k in _NODE_KEYS else v) for k, v in values.items()}
    used = any("{" in part for part in template)
    out = [part.format_map(_Strict(values)) for part in template]
    if not used:
        out += [values["node"], values["action"]] if "action" in values else [values["node"]]
    return out


_NODE_KEYS = frozenset({"node", "address", "hostname"})


class _Strict(dict[str, str]):
    def __missing__(self, key: str) -> str:
        raise KeyError(f"unknown placeholder {{{key}}}")


def run_command(argv: list[str], timeout: float, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Run argv with its own process group; (exit code, output tail). Timeout -> ExternalError.

    Output goes to an unlinked temporary file, not a pipe: if the controller dies mid-call, a re-imaging
    script writing its progress must not die of SIGPIPE halfway through (the restarted controller waits
    for the node that script is bringing back).
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    with tempfile.TemporaryFile(mode="w+b") as out_file:
        try:
            proc = subprocess.Popen(argv, stdout=out_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=full_env, start_new_session=True)
        except OSError as err:
            raise ExternalError(f"cannot run {argv[0]!r}: {err.strerror or err}") from None
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise ExternalError(f"`{' '.join(argv)}` timed out after {timeout:g} s; output: "
                                f"{_tail(out_file)[-300:].strip()}") from None
        return proc.returncode, _tail(out_file)


def _tail(f: IO[bytes]) -> str:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - OUTPUT_TAIL * 4))
    return f.read().decode(errors="replace")[-OUTPUT_TAIL:]


class ScriptProvider:
    name = "script"
    Options: ClassVar[type[ScriptOptions]] = ScriptOptions

    def __init__(self, options: ScriptOptions, context: ProviderContext) -> None:
        self.options = options
        self.group = context.group
        try:
            render(options.command, {"node": "n", "action": "reboot", "address": "a", "hostname": "h"})
        except (KeyError, ValueError, IndexError) as err:
            from hpresilience.errors import ConfigError

            raise ConfigError(f"controller node group {self.group!r}, provider 'script': command: {err}") from None

    def act(self, node: Node, action: str) -> str:
        argv = render(self.options.command, {"node": node.name, "action": action, "address": node.address,
                                             "hostname": node.hostname})
        rc, out = run_command(argv, self.options.timeout_s, self.options.env)
        log.info("provider_script_finished", node=node.name, action=action, argv=argv, exit_code=rc,
                 output=out.strip()[-1000:])
        if rc != 0:
            last = out.strip().splitlines()[-1] if out.strip() else "no output"
            raise ExternalError(f"`{' '.join(argv)}` exited {rc}: {last}")
        return f"`{' '.join(argv)}` exited 0"
