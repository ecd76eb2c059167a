"""NVSwitch boards: the fabric manager service state, read through systemctl."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hpresilience.health.base import CheckContext, Status, SuggestedAction
from hpresilience.health.checks.common import nvswitch_pci_devices
from hpresilience.health.checks.nvswitch import FabricManager, FabricManagerOptions
from hpresilience.health.runner import run_one


def with_nvswitches(ctx: CheckContext, n: int = 4) -> None:
    """NVSwitches as sysfs shows them on an HGX H100 board (vendor 0x10de, class 0x068000), plus one GPU."""
    for i in range(n):
        d = ctx.paths.sys("bus", "pci", "devices", f"0000:{0xC5 + i:02x}:00.0")
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x068000\n")
    gpu = ctx.paths.sys("bus", "pci", "devices", "0000:1b:00.0")
    gpu.mkdir(parents=True)
    (gpu / "vendor").write_text("0x10de\n")
    (gpu / "class").write_text("0x030200\n")


def systemctl(fake_tool: Callable[[str, str], str], tmp_path: Path, state: str, rc: int) -> str:
    return fake_tool("systemctl", f'echo "$@" > {tmp_path}/args; echo {state}; exit {rc}')


def test_switches_are_found_and_gpus_are_not_switches(ctx_factory: Callable[..., CheckContext]) -> None:
    ctx = ctx_factory()
    with_nvswitches(ctx)
    assert nvswitch_pci_devices(ctx.paths) == ["0000:c5:00.0", "0000:c6:00.0", "0000:c7:00.0", "0000:c8:00.0"]


@pytest.mark.parametrize(
    ("state", "rc", "status", "action"),
    [
        ("active", 0, Status.OK, SuggestedAction.NONE),
        ("inactive", 3, Status.FAIL, SuggestedAction.REBOOT),
        ("failed", 3, Status.FAIL, SuggestedAction.REBOOT),
        ("activating", 3, Status.WARN, SuggestedAction.NONE),
    ],
)
def test_fabric_manager_state_decides(
    ctx_factory: Callable[..., CheckContext],
    fake_tool: Callable[[str, str], str],
    tmp_path: Path,
    state: str,
    rc: int,
    status: Status,
    action: SuggestedAction,
) -> None:
    ctx = ctx_factory(commands={"systemctl": systemctl(fake_tool, tmp_path, state, rc)})
    with_nvswitches(ctx)
    r = run_one(FabricManager(FabricManagerOptions(), ctx))
    assert (r.status, r.action) == (status, action), r.reason
    assert (tmp_path / "args").read_text().split() == ["is-active", "--", "nvidia-fabricmanager"]
    if status == Status.FAIL:
        assert r.key == "nvswitch.fabricmanager" and not r.certain and "4 NVSwitch" in r.reason


def test_no_nvswitch_is_not_applicable_unless_required(
    ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str], tmp_path: Path
) -> None:
    ctx = ctx_factory(commands={"systemctl": systemctl(fake_tool, tmp_path, "inactive", 3)})
    assert run_one(FabricManager(FabricManagerOptions(), ctx)).status == Status.NOT_APPLICABLE
    r = run_one(FabricManager(FabricManagerOptions(required=True), ctx))
    assert (r.status, r.action) == (Status.FAIL, SuggestedAction.REBOOT)


def test_missing_systemctl_is_unknown(ctx_factory: Callable[..., CheckContext]) -> None:
    ctx = ctx_factory(commands={"systemctl": "/nonexistent/systemctl"})
    with_nvswitches(ctx)
    r = run_one(FabricManager(FabricManagerOptions(), ctx))
    assert (r.status, r.action) == (Status.UNKNOWN, SuggestedAction.NONE)


def test_service_name_that_could_be_an_option_is_refused() -> None:
    with pytest.raises(ValueError):
        FabricManagerOptions(service="--now")
