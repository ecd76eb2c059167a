"""The `script` and `reboot` providers and the health gates, with real processes."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpresilience.controller.gates import GateSettings, create_gate
from hpresilience.controller.providers import ProviderContext, create_provider
from hpresilience.controller.templates import render, run_site_command
from hpresilience.errors import ExternalError, SlurmError
from hpresilience.reasons import Action
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.slurm.runner import CommandRunner

NODE = Node(name="gpu-3", address="10.0.0.3", hostname="ip-10-0-0-3", states=frozenset({"IDLE", "DRAIN"}))


def script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "site.sh"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return str(p)


def ctx() -> ProviderContext:
    return ProviderContext(SlurmClient(), "default")


def test_script_gets_node_and_action_appended_and_reports_success(tmp_path: Path) -> None:
    cmd = script(tmp_path, f'echo "$@" > "{tmp_path}/args"; echo power-cycled\n')
    p = create_provider("script", {"command": [cmd]}, ctx())
    assert p.act(NODE, Action.REBOOT) == f"`{cmd} gpu-3 reboot` exited 0"
    assert (tmp_path / "args").read_text() == "gpu-3 reboot\n"


def test_script_placeholders_fill_in_place() -> None:
    assert render(
        ["ipmitool", "-H", "{hostname}-bmc", "power", "{action}"],
        {"node": "gpu-3", "action": "cycle", "hostname": "h", "address": "a"},
    ) == ["ipmitool", "-H", "h-bmc", "power", "cycle"]


def test_script_failure_carries_exit_code_and_last_line(tmp_path: Path) -> None:
    cmd = script(tmp_path, "echo starting; echo 'BMC unreachable' >&2; exit 3\n")
    p = create_provider("script", {"command": [cmd]}, ctx())
    with pytest.raises(ExternalError, match="exited 3: BMC unreachable"):
        p.act(NODE, Action.REPLACE)


def test_script_timeout_kills_its_process_group(tmp_path: Path) -> None:
    cmd = script(tmp_path, f'sleep 30 & echo $! > "{tmp_path}/child"; wait\n')
    p = create_provider("script", {"command": [cmd], "timeout_s": 2.0}, ctx())  # room to start on a loaded box
    started = time.monotonic()
    with pytest.raises(ExternalError, match=r"timed out after 2 s"):
        p.act(NODE, Action.REPLACE)
    assert time.monotonic() - started < 10
    child = int((tmp_path / "child").read_text())

    def gone() -> bool:
        try:
            return "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
        except OSError:
            return True

    # SIGKILL is delivered at once, but a loaded kernel may take a moment to tear the process down.
    deadline = time.monotonic() + 5
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone()


def test_command_gate_passes_on_exit_0_and_fails_with_output(tmp_path: Path) -> None:
    cmd = script(tmp_path, 'if [ "$1" = 10.0.0.3 ]; then echo "all 8 GPUs ok"; exit 0; fi; echo "dcgm: fail"; exit 1\n')
    ok = create_gate(GateSettings(kind="command", command=[cmd, "{address}"])).check(NODE)
    assert ok.passed and ok.detail == "exit 0: all 8 GPUs ok"
    bad = create_gate(GateSettings(kind="command", command=[cmd, "{node}"])).check(NODE)
    assert not bad.passed and bad.detail == "exit 1: dcgm: fail"


def test_command_gate_timeout_or_missing_command_is_a_failed_gate(tmp_path: Path) -> None:
    slow = create_gate(
        GateSettings(kind="command", command=[sys.executable, "-c", "import time; time.sleep(20)"], timeout_s=0.3)
    )
    res = slow.check(NODE)
    assert not res.passed and "timed out" in res.detail
    missing = create_gate(GateSettings(kind="command", command=[str(tmp_path / "nope"), "{node}"])).check(NODE)
    assert not missing.passed and "cannot run" in missing.detail


def test_none_gate_always_passes() -> None:
    assert create_gate(GateSettings(kind="none")).check(NODE).passed


def test_reboot_provider_issues_scontrol_reboot_asap_with_our_reason(tmp_path: Path) -> None:
    """The reason is ours, not Slurm's "Reboot ASAP": slurmctld then keeps our DRAIN across the reboot."""
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/argv"\n')
    fake.chmod(0o755)
    client = SlurmClient(CommandRunner(str(tmp_path), timeout=5, retries=0))
    p = create_provider("reboot", {}, ProviderContext(client, "default"))
    assert p.act(NODE, Action.REBOOT) == "scontrol reboot ASAP nextstate=resume"
    assert (tmp_path / "argv").read_text().splitlines() == [
        "reboot",
        "ASAP",
        "nextstate=RESUME",
        "reason=[hpr-controller] repair: reboot by scontrol reboot",
        "gpu-3",
    ]
    assert "rebooted instead" in p.act(NODE, Action.REPLACE)


def test_reboot_provider_failure_is_a_slurm_error(tmp_path: Path) -> None:
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\necho 'scontrol_reboot_nodes error: Unspecified error' >&2\nexit 1\n")
    fake.chmod(0o755)
    p = create_provider(
        "reboot",
        {"asap": False},
        ProviderContext(SlurmClient(CommandRunner(str(tmp_path), timeout=5, retries=0)), "default"),
    )
    with pytest.raises(SlurmError, match="Unspecified error"):
        p.act(NODE, Action.REBOOT)


def _proxy_command_attack(tmp_path: Path) -> tuple[Node, Path]:
    """A node whose NodeAddr is an ssh option: `-oProxyCommand=SCRIPT`, with SCRIPT leaving a marker."""
    marker = tmp_path / "pwned"
    payload = script(tmp_path, f'touch "{marker}"\n')
    return Node(
        name="gpu-3", address=f"-oProxyCommand={payload}", hostname="gpu-3", states=frozenset({"IDLE", "DRAIN"})
    ), marker


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the ssh client to replay the attack")
def test_ssh_gate_does_not_run_a_proxycommand_smuggled_in_as_node_address(tmp_path: Path) -> None:
    """Issue 14 item 13: the default `ssh ... {address} ...` gate ran the ProxyCommand (as root, on the head
    node). The address is refused before ssh runs, and the gate fails naming it."""
    evil, marker = _proxy_command_attack(tmp_path)
    result = create_gate(GateSettings(kind="command", timeout_s=20)).check(evil)
    assert not marker.exists()
    assert not result.passed and "begins with '-'" in result.detail


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the ssh client to replay the attack")
def test_ssh_gate_template_ends_ssh_options_before_the_address(tmp_path: Path) -> None:
    """The second wall: with `--` in the template, even an unchecked value is a host name to ssh."""
    evil, marker = _proxy_command_attack(tmp_path)
    argv = GateSettings().command
    assert argv[argv.index("{address}") - 1] == "--"
    filled = [evil.address if part == "{address}" else part for part in argv]
    filled[-2:] = ["true"]  # whatever runs remotely is beside the point: ssh must not get that far
    run_site_command(filled, 20)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "-rf"),
        ("name", "gpu 3"),
        ("address", "--help"),
        ("hostname", "a\tb"),
        ("name", "n\n1"),
    ],
)
def test_script_provider_refuses_option_like_or_split_node_values(tmp_path: Path, field: str, value: str) -> None:
    """Issue 14 item 13: the `script` provider appended the node name bare, so `-x` became an option."""
    cmd = script(tmp_path, f'echo "$@" > "{tmp_path}/args"\n')
    p = create_provider("script", {"command": [cmd, "{node}", "{address}", "{hostname}", "{action}"]}, ctx())
    fields: dict[str, Any] = {"name": "gpu-3", "address": "10.0.0.3", "hostname": "ip-10-0-0-3", field: value}
    with pytest.raises(ExternalError, match=f"refusing node {'node' if field == 'name' else field} "):
        p.act(Node(states=frozenset({"IDLE"}), **fields), Action.REBOOT)
    assert not (tmp_path / "args").exists()


def test_script_provider_appended_node_is_checked_too(tmp_path: Path) -> None:
    cmd = script(tmp_path, f'echo "$@" > "{tmp_path}/args"\n')
    p = create_provider("script", {"command": [cmd]}, ctx())
    with pytest.raises(ExternalError, match="begins with '-'"):
        p.act(Node(name="-n1", address="10.0.0.3", hostname="h", states=frozenset({"IDLE"})), Action.REPLACE)
    assert not (tmp_path / "args").exists()
