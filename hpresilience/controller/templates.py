"""The controller's site commands (the `script` provider, the `command` gate): filling their templates and
running them.

A template is an argv list with `{node}`-style placeholders, filled without a shell. Node-derived values
come from Slurm, so they are checked before they reach a command line.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping

from hpresilience import proc
from hpresilience.errors import EnvironmentMissing, ExternalError

_NODE_KEYS = frozenset({"node", "address", "hostname"})
# What a health gate's command may name (it has no action: it checks, whatever repaired the node).
GATE_KEYS = ("node", "address", "hostname")


def check_node_value(key: str, value: str) -> str:
    """A node name, address or host name as Slurm reports it, refused if a command could read it as an
    option (`-oProxyCommand=...` ran as root through ssh) or split it (whitespace, control characters)."""
    if value.startswith("-") or any(c.isspace() or not c.isprintable() for c in value):
        raise ExternalError(
            f"refusing node {key} {value!r} as a command argument: it begins with '-' "
            "or holds whitespace or control characters"
        )
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


def template_problem(template: list[str], keys: tuple[str, ...]) -> str | None:
    """What is wrong with a command template given the placeholders it may use, or None: checked when the
    configuration loads, so a typo fails `config show` rather than the first repair at 3 a.m."""
    if not template:
        return "the command is empty"
    try:
        render(template, {k: k[0] for k in keys})
    except (KeyError, ValueError, IndexError) as err:
        known = ", ".join("{" + k + "}" for k in keys)
        return f"{str(err).strip(chr(39))} (known: {known})"
    return None


def job_command_problem(command: list[str]) -> str | None:
    """The `slurm` gate's job command: placeholders are filled where it has some, and nothing is appended."""
    if not command:
        return "the command is empty"
    return template_problem(command, GATE_KEYS) if any("{" in part for part in command) else None


class _Strict(dict[str, str]):
    def __missing__(self, key: str) -> str:
        raise KeyError(f"unknown placeholder {{{key}}}")


def run_site_command(argv: list[str], timeout: float, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Run a site command; (exit code, output tail). A timeout or a command that cannot start: ExternalError.

    Output goes to an unlinked temporary file, not a pipe: if the controller dies mid-call, a re-imaging
    script writing its progress must not die of SIGPIPE halfway through (the restarted controller waits
    for the node that script is bringing back). A daemon it leaves behind on purpose (ssh's ControlPersist
    master) is left alone.
    """
    with tempfile.TemporaryFile(mode="w+b") as out_file:
        try:
            res = proc.run(argv, timeout, extra_env=env, output=out_file, kill_leftovers=False)
        except EnvironmentMissing as err:  # to the controller, a missing site tool is a failed action
            raise ExternalError(str(err)) from None
    if res.timed_out:
        raise ExternalError(f"`{' '.join(argv)}` timed out after {timeout:g} s; output: {res.stdout[-300:].strip()}")
    assert res.returncode is not None
    return res.returncode, res.stdout
