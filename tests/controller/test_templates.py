"""Site command templates (the `script` provider, the `command` gate) are checked when the configuration
loads: a placeholder typo fails `config show`, not the first repair."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpresilience.cli import main
from hpresilience.controller.providers.script import SCRIPT_KEYS
from hpresilience.controller.templates import GATE_KEYS, template_problem


def test_template_problem_names_the_unknown_placeholder_and_the_known_ones() -> None:
    assert template_problem(["ssh", "--", "{address}", "check"], GATE_KEYS) is None
    assert template_problem(["/bin/reimage"], SCRIPT_KEYS) is None  # no placeholder: node and action appended
    problem = template_problem(["ssh", "{adress}"], GATE_KEYS)
    assert problem == "unknown placeholder {adress} (known: {node}, {address}, {hostname})"
    assert template_problem(["x", "{action}"], GATE_KEYS) is not None  # a gate has no action
    assert template_problem([], GATE_KEYS) == "the command is empty"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (
            "controller:\n  gate:\n    kind: command\n    command: [ssh, '{adress}', hpresilience, check]\n",
            "controller.gate.command: unknown placeholder {adress}",
        ),
        ("controller:\n  gate:\n    kind: command\n    command: []\n", "controller.gate.command: the command is empty"),
        (
            "controller:\n  gate:\n    job_command: [hpresilience, check, '{nod}']\n",
            "controller.gate.job_command: unknown placeholder {nod}",
        ),
        (
            "controller:\n  groups:\n    - name: g\n      nodes: ['n[1-2]']\n      provider: script\n"
            "      options:\n        command: [/bin/reimage, '{nod}']\n",
            "controller.groups[0].options.command: unknown placeholder {nod}",
        ),
    ],
)
def test_config_show_refuses_a_template_typo_naming_its_key_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, where: str
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(body)
    assert main(["--config", str(cfg), "config", "show"]) == 2
    assert f"{cfg}: {where}" in capsys.readouterr().err


def test_a_gate_that_runs_nothing_does_not_check_the_command_template(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("controller:\n  gate:\n    kind: none\n    command: ['{whatever}']\n")
    assert main(["--config", str(cfg), "config", "show"]) == 0
