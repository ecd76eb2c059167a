"""NVSwitch boards: the fabric manager service state, read through systemctl."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpresilience.health.base import CheckContext, Status
from hpresilience.health.checks.common import nvswitch_pci_devices
from hpresilience.health.checks.nvswitch import FabricManager, FabricManagerOptions
from hpresilience.health.runner import run_one
from hpresilience.reasons import Action
from tests.health.conftest import FIXTURES


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
        ("active", 0, Status.OK, Action.NONE),
        ("inactive", 3, Status.FAIL, Action.REBOOT),
        ("failed", 3, Status.FAIL, Action.REBOOT),
        ("activating", 3, Status.WARN, Action.NONE),
    ],
)
def test_fabric_manager_state_decides(
    ctx_factory: Callable[..., CheckContext],
    fake_tool: Callable[[str, str], str],
    tmp_path: Path,
    state: str,
    rc: int,
    status: Status,
    action: Action,
) -> None:
    ctx = ctx_factory(commands={"systemctl": systemctl(fake_tool, tmp_path, state, rc)})
    with_nvswitches(ctx)
    r = run_one(FabricManager(FabricManagerOptions(log_path=""), ctx))
    assert (r.status, r.action) == (status, action), r.reason
    assert (tmp_path / "args").read_text().split() == ["is-active", "--", "nvidia-fabricmanager"]
    if status == Status.FAIL:
        assert r.key == "nvswitch.fabricmanager" and not r.certain and "4 NVSwitch" in r.reason


def test_no_nvswitch_is_not_applicable_unless_required(
    ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str], tmp_path: Path
) -> None:
    ctx = ctx_factory(commands={"systemctl": systemctl(fake_tool, tmp_path, "inactive", 3)})
    assert run_one(FabricManager(FabricManagerOptions(log_path=""), ctx)).status == Status.NOT_APPLICABLE
    r = run_one(FabricManager(FabricManagerOptions(required=True, log_path=""), ctx))
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT)


def test_missing_systemctl_is_unknown(ctx_factory: Callable[..., CheckContext]) -> None:
    ctx = ctx_factory(commands={"systemctl": "/nonexistent/systemctl"})
    with_nvswitches(ctx)
    r = run_one(FabricManager(FabricManagerOptions(), ctx))
    assert (r.status, r.action) == (Status.UNKNOWN, Action.NONE)


def test_service_name_that_could_be_an_option_is_refused() -> None:
    with pytest.raises(ValueError):
        FabricManagerOptions(service="--now")


def booted_at(ctx: CheckContext, when: str) -> None:
    """`btime` in <proc>/stat, from a local time as the fabric manager writes it."""
    btime = int(time.mktime(time.strptime(when, "%b %d %Y %H:%M:%S")))
    ctx.paths.proc("stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\n")


def test_fatal_sxid_the_fabric_manager_logged_this_boot_reboots(
    ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str], tmp_path: Path
) -> None:
    ctx = ctx_factory(commands={"systemctl": systemctl(fake_tool, tmp_path, "active", 0)})
    with_nvswitches(ctx)
    booted_at(ctx, "Mar 03 2026 08:00:00")
    r = run_one(FabricManager(FabricManagerOptions(log_path=str(FIXTURES / "fabricmanager.log")), ctx))
    assert (r.status, r.action, r.key, r.certain) == (
        Status.FAIL,
        Action.REBOOT,
        "nvswitch:20034:0000:c6:00",  # the same key as the kernel's SXid line for this switch
        True,
    )
    keys = {f["key"]: f["catalog_action"] for f in r.evidence["findings"]}
    # The fatal 20034 on c7 is from the previous boot: not counted. The non-fatal 12028 only warns.
    assert keys == {"nvswitch:12028:0000:c5:00:nonfatal": "warn", "nvswitch:20034:0000:c6:00": "reboot_then_replace"}


def test_non_fatal_sxid_in_the_log_warns(
    ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str], tmp_path: Path
) -> None:
    ctx = ctx_factory(commands={"systemctl": systemctl(fake_tool, tmp_path, "active", 0)})
    with_nvswitches(ctx)
    booted_at(ctx, "Mar 03 2026 08:00:00")
    log = tmp_path / "fm.log"
    lines = (FIXTURES / "fabricmanager.log").read_text().splitlines(True)
    log.write_text("".join(ln for ln in lines if "13:02:58" not in ln))
    r = run_one(FabricManager(FabricManagerOptions(log_path=str(log)), ctx))
    assert (r.status, r.action) == (Status.WARN, Action.NONE) and "SXid 12028 nonfatal" in r.reason
    booted_at(ctx, "Mar 03 2026 12:00:00")
    assert run_one(FabricManager(FabricManagerOptions(log_path=str(log)), ctx)).status == Status.OK


def test_unreadable_fabric_manager_log_leaves_the_service_verdict(
    ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str], tmp_path: Path
) -> None:
    ctx = ctx_factory(commands={"systemctl": systemctl(fake_tool, tmp_path, "active", 0)})
    with_nvswitches(ctx)
    r = run_one(FabricManager(FabricManagerOptions(log_path=str(tmp_path / "absent.log")), ctx))
    assert r.status == Status.OK
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)  # would block a plain open() forever
    r = run_one(FabricManager(FabricManagerOptions(log_path=str(fifo)), ctx))
    assert r.status == Status.OK  # a blocked read would end in the runner's timeout: unknown
