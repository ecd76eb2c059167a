"""GPU checks over recorded NVML snapshots and recorded `nvidia-smi -q -x` XML."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpresilience.errors import ConfigError
from hpresilience.health.base import HostPaths, Status
from hpresilience.health.nvml import NvmlUnavailable, PynvmlReader, parse_nvidia_smi_xml
from hpresilience.health.settings import HealthSettings
from hpresilience.reasons import Action
from hpresilience.testing.fakenode import FakeNode
from tests.health.conftest import FIXTURES, node_settings, run_node

XML = (FIXTURES / "nvidia-smi-q-x-h100.xml").read_text()


def test_nvidia_smi_xml_parses_into_the_snapshot_fields() -> None:
    snap = parse_nvidia_smi_xml(XML)
    assert snap.driver_version == "550.127.05" and snap.count == 2
    g = snap.gpus[1]
    assert g.pci_bus_id == "00000000:64:00.0" and g.uuid.startswith("GPU-0a92")
    assert (g.ecc_volatile_uncorrected, g.ecc_aggregate_uncorrected, g.remapped_rows_corrected) == (0, 0, 1)
    assert (g.remap_pending, g.remap_failure, g.sram_threshold_exceeded) == (False, False, False)
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (5, 5, 16, 16)
    assert g.clock_event_reasons == 0x1 and g.retired_pages_sbe is None


def test_nvidia_smi_xml_faults_are_read() -> None:
    bad = (
        XML.replace("<remapped_row_pending>No", "<remapped_row_pending>Yes", 1)
        .replace("<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>3</dram_uncorrectable>", 1)
        .replace("<current_link_width>16x", "<current_link_width>8x", 1)
        .replace(
            "<clocks_event_reason_hw_thermal_slowdown>Not Active",
            "<clocks_event_reason_hw_thermal_slowdown>Active",
            1,
        )
    )
    g = parse_nvidia_smi_xml(bad).gpus[0]
    assert g.remap_pending and g.ecc_volatile_uncorrected == 3 and g.pcie_width_current == 8
    assert g.clock_event_reasons == 0x1 | 0x40


def test_nvidia_smi_fallback_feeds_the_checks(p5: FakeNode, fake_tool: Callable[[str, str], str]) -> None:
    xml = FIXTURES / "nvidia-smi-q-x-h100.xml"
    tool = fake_tool("nvidia-smi", f'[ "$1" = "-q" ] && [ "$2" = "-x" ] && exec cat {xml}\nexit 9')
    from hpresilience.health.api import run_profile
    from tests.health.conftest import node_settings

    s = node_settings(p5)
    s = s.model_copy(update={"nvml": "nvidia-smi", "commands": s.commands.model_copy(update={"nvidia_smi": tool})})
    _, results, _ = run_profile(s, only=["gpu.count", "gpu.memory"])
    count, mem = results
    assert count.status == Status.FAIL and count.evidence["source"] == "nvidia-smi"
    assert "2 usable GPU(s), profile expects 8" in count.reason and not count.certain
    assert mem.status == Status.OK


def test_healthy_p5_passes_every_gpu_check(p5: FakeNode) -> None:
    res, verdict = run_node(p5, ["gpu.count", "gpu.memory", "gpu.pcie", "gpu.clocks", "gpu.recovery"])
    assert {r.status for r in res.values()} == {Status.OK}, {k: r.reason for k, r in res.items()}
    assert verdict.exit_code == 0


def test_remap_failure_asks_for_replace_at_once(p5: FakeNode) -> None:
    p5.inject("remap_failure:3")
    r = run_node(p5, ["gpu.memory"])[0]["gpu.memory"]
    assert (r.status, r.action, r.certain) == (Status.FAIL, Action.REPLACE, True)
    assert r.key == "gpu.remap_failure:0000:86:00"


def test_remap_pending_reboots_then_replaces_when_it_survives_reboots(p5: FakeNode) -> None:
    seen = []
    for _ in range(3):
        p5.inject("remap_pending:1")
        seen.append(run_node(p5, ["gpu.memory"])[0]["gpu.memory"].action)
        p5.reboot()
    assert seen == [Action.REBOOT, Action.REBOOT, Action.REPLACE]


@pytest.mark.parametrize(
    ("unc", "limit", "status"), [(511, 512, Status.OK), (512, 512, Status.FAIL), (3, 2, Status.FAIL)]
)
def test_uncorrectable_remap_threshold(p5: FakeNode, unc: int, limit: int, status: Status) -> None:
    p5.set_gpu(0, remapped_rows_uncorrected=unc)
    r = run_node(p5, ["gpu.memory"], **{"gpu.memory": {"max_uncorrectable_remaps": limit}})[0]["gpu.memory"]
    assert r.status == status
    if status == Status.FAIL:
        assert r.action == Action.REPLACE


@pytest.mark.parametrize(("vol", "limit", "status"), [(0, 0, Status.OK), (1, 0, Status.FAIL), (5, 10, Status.OK)])
def test_volatile_uncorrected_ecc_threshold(p5: FakeNode, vol: int, limit: int, status: Status) -> None:
    p5.inject(f"ecc:2:{vol}")
    r = run_node(p5, ["gpu.memory"], **{"gpu.memory": {"max_volatile_uncorrected": limit}})[0]["gpu.memory"]
    assert r.status == status
    if status == Status.FAIL:
        assert r.action == Action.REBOOT and r.evidence["findings"][0]["value"] == vol


def test_aggregate_ecc_judged_only_when_a_limit_is_set(p5: FakeNode) -> None:
    p5.set_gpu(0, ecc_aggregate_uncorrected=40)
    assert run_node(p5, ["gpu.memory"])[0]["gpu.memory"].status == Status.OK
    r = run_node(p5, ["gpu.memory"], **{"gpu.memory": {"max_aggregate_uncorrected": 10}})[0]["gpu.memory"]
    assert r.action == Action.REPLACE


def test_retired_pages_at_the_limit_replace(p5: FakeNode) -> None:
    p5.set_gpu(4, retired_pages_sbe=40, retired_pages_dbe=20, retired_pages_pending=False)
    r = run_node(p5, ["gpu.memory"])[0]["gpu.memory"]
    assert r.action == Action.REPLACE and "60 retired pages" in r.reason


def test_pcie_width_below_max_warns_and_generation_only_when_asked(p5: FakeNode) -> None:
    p5.set_gpu(5, pcie_gen_current=1)
    assert run_node(p5, ["gpu.pcie"])[0]["gpu.pcie"].status == Status.OK  # gen drops at idle: not judged
    assert run_node(p5, ["gpu.pcie"], **{"gpu.pcie": {"check_generation": True}})[0]["gpu.pcie"].status == Status.WARN
    p5.set_gpu(5, pcie_gen_current=5, pcie_width_current=8)
    r = run_node(p5, ["gpu.pcie"])[0]["gpu.pcie"]
    assert (r.status, r.action) == (Status.WARN, Action.NONE) and "x8, max x16" in r.reason


def test_hw_thermal_and_power_brake_slowdown_warn_sw_power_cap_does_not(p5: FakeNode) -> None:
    p5.set_gpu(0, clock_event_reasons=0x1 | 0x4)
    assert run_node(p5, ["gpu.clocks"])[0]["gpu.clocks"].status == Status.OK
    p5.set_gpu(0, clock_event_reasons=0x80)
    r = run_node(p5, ["gpu.clocks"])[0]["gpu.clocks"]
    assert r.status == Status.WARN and "hw_power_brake_slowdown" in r.reason


@pytest.mark.parametrize(
    ("value", "status", "action"),
    [
        (0, Status.OK, Action.NONE),
        (2, Status.FAIL, Action.REBOOT),
        (4, Status.FAIL, Action.REBOOT),
        (5, Status.WARN, Action.NONE),
        (None, Status.OK, Action.NONE),
    ],
)
def test_driver_recovery_action_field(p5: FakeNode, value: int | None, status: Status, action: Action) -> None:
    p5.set_gpu(6, recovery_action=value)
    r = run_node(p5, ["gpu.recovery"])[0]["gpu.recovery"]
    assert (r.status, r.action) == (status, action)


def test_lost_gpu_fails_count_and_shares_the_xid79_ladder(p5: FakeNode) -> None:
    p5.inject("gpu_lost:2")
    p5.inject("xid:79:2")
    res = run_node(p5, ["gpu.count", "xid", "gpu.memory"])[0]
    assert res["gpu.count"].status == Status.FAIL and res["gpu.count"].key == "nvidia:79:0000:75:00"
    assert res["xid"].key == "nvidia:79:0000:75:00"
    assert res["gpu.memory"].status == Status.OK  # the other 7 GPUs are still judged


def test_missing_gpu_is_a_reboot_that_needs_a_repeat(p5: FakeNode) -> None:
    p5.inject("gpu_missing")
    r = run_node(p5, ["gpu.count"])[0]["gpu.count"]
    assert (r.status, r.action, r.certain) == (Status.FAIL, Action.REBOOT, False)


def test_nvml_unusable_with_gpus_on_pci_fails_count_and_is_unknown_elsewhere(p5: FakeNode) -> None:
    p5.write_nvml({"unavailable": "NVML init failed: Driver Not Loaded"})
    res = run_node(p5, ["gpu.count", "gpu.memory"])[0]
    assert res["gpu.count"].status == Status.FAIL and "8 NVIDIA GPU(s) on PCI" in res["gpu.count"].reason
    assert res["gpu.memory"].status == Status.UNKNOWN and res["gpu.memory"].action == Action.NONE


def test_no_gpus_anywhere_is_not_applicable(tmp_path: Path) -> None:
    node = FakeNode.make(tmp_path / "cpu", "generic")
    res = run_node(node, ["gpu.count", "gpu.memory", "gpu.recovery"])[0]
    assert {r.status for r in res.values()} == {Status.NOT_APPLICABLE}


def test_required_gpus_absent_fail(tmp_path: Path) -> None:
    node = FakeNode.make(tmp_path / "cpu", "generic")
    r = run_node(node, ["gpu.memory"], **{"gpu.memory": {"required": True}})[0]["gpu.memory"]
    assert r.status == Status.FAIL and "required but absent" in r.reason


def _gpu_available() -> bool:
    try:
        return PynvmlReader().snapshot().count > 0
    except NvmlUnavailable:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_available(), reason="no NVIDIA GPU / NVML on this machine")
def test_real_nvml_snapshot_reads_every_gpu() -> None:
    snap = PynvmlReader().snapshot()
    assert snap.source == "nvml" and snap.driver_version
    for g in snap.gpus:
        assert g.pci_bus_id and g.uuid.startswith(("GPU-", "MIG-")) and not g.lost
        assert g.pcie_width_max is not None and g.ecc_volatile_uncorrected is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_available(), reason="no NVIDIA GPU / NVML on this machine")
def test_real_nvml_xid_event_source_opens_and_times_out_quietly() -> None:
    from hpresilience.health.events import NvmlXidSource

    src = NvmlXidSource()
    try:
        assert src.poll(0.2) == []
    finally:
        src.close()


def test_fewer_gpus_in_nvml_than_on_pci_is_reported(p5: FakeNode) -> None:
    p5.inject("gpu_missing")
    r = run_node(p5, ["gpu.count"])[0]["gpu.count"]
    whats = [f["what"] for f in r.evidence["findings"]]
    assert "8 NVIDIA GPUs on PCI, NVML sees 7" in whats and r.action == Action.REBOOT


# -- issue 13: what real recordings showed ----------------------------------------------------------------
B200 = (FIXTURES / "nvidia-smi-q-x-b200-v13.xml").read_text()


@pytest.mark.parametrize(
    ("word", "value"),
    [("None", 0), ("Reset", 1), ("Reboot", 2), ("Drain P2P", 3), ("Drain and Reset", 4), ("Recalibrate", -1)],
)
def test_nvidia_smi_recovery_action_words_are_read(word: str, value: int) -> None:
    """nvidia-smi prints `Reset`/`Reboot` (seen on a real node stuck needing a reset); NVML's long names too."""
    xml = B200.replace("<gpu_recovery_action>None", f"<gpu_recovery_action>{word}", 1)
    g = parse_nvidia_smi_xml(xml).gpus[0]
    assert g.recovery_action == value and g.recovery_action_text == word


def _smi_settings(node: FakeNode, fake_tool: Callable[[str, str], str], xml: str) -> HealthSettings:
    path = node.root / "smi.xml"
    path.write_text(xml)
    tool = fake_tool("nvidia-smi", f'[ "$1" = "-q" ] && [ "$2" = "-x" ] && exec cat {path}\nexit 9')
    s = node_settings(node)
    return s.model_copy(update={"nvml": "nvidia-smi", "commands": s.commands.model_copy(update={"nvidia_smi": tool})})


def test_recovery_reset_from_nvidia_smi_fails_and_an_unknown_word_is_unknown(
    p5: FakeNode, fake_tool: Callable[[str, str], str]
) -> None:
    from hpresilience.health.api import run_profile

    s = _smi_settings(p5, fake_tool, B200.replace("<gpu_recovery_action>None", "<gpu_recovery_action>Reset", 1))
    r = run_profile(s, only=["gpu.recovery"])[1][0]
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT) and "gpu_reset" in r.reason
    s = _smi_settings(p5, fake_tool, B200.replace("<gpu_recovery_action>None", "<gpu_recovery_action>Zap", 1))
    r = run_profile(s, only=["gpu.recovery"])[1][0]
    assert (r.status, r.action) == (Status.UNKNOWN, Action.NONE) and "'Zap'" in r.reason


def test_schema_v13_memory_repair_flags_are_read_and_judged(p5: FakeNode, fake_tool: Callable[[str, str], str]) -> None:
    from hpresilience.health.api import run_profile

    healthy = parse_nvidia_smi_xml(B200).gpus[0]
    assert (healthy.channel_repair_pending, healthy.tpc_repair_pending, healthy.unrepairable_memory) == (
        False,
        False,
        False,
    )
    cases = [
        ("channel_repair_pending", Action.REBOOT, "gpu.channel_repair_pending:0000:1b:00"),
        ("tpc_repair_pending", Action.REBOOT, "gpu.tpc_repair_pending:0000:1b:00"),
        ("unrepairable_memory", Action.REPLACE, "gpu.unrepairable_memory:0000:1b:00"),
    ]
    for tag, action, key in cases:
        xml = B200.replace(f"<{tag}>No", f"<{tag}>Yes", 1)
        r = run_profile(_smi_settings(p5, fake_tool, xml), only=["gpu.memory"])[1][0]
        assert (r.status, r.action, r.key, r.certain) == (Status.FAIL, action, key, True), tag
    xml = B200.replace("<tpc_repair_pending>No", "<tpc_repair_pending>Yes", 1)
    s = _smi_settings(p5, fake_tool, xml)
    s = s.model_copy(update={"checks": {**s.checks, "gpu.memory": {"repair_pending_action": "warn"}}})
    r = run_profile(s, only=["gpu.memory"])[1][0]
    assert (r.status, r.action) == (Status.WARN, Action.NONE)


def test_pcie_expectation_is_a_profile_setting(p5: FakeNode) -> None:
    for i in range(8):
        p5.set_gpu(i, pcie_width_current=8)
    assert run_node(p5, ["gpu.pcie"])[0]["gpu.pcie"].status == Status.WARN
    r = run_node(p5, ["gpu.pcie"], **{"gpu.pcie": {"expected_width": 8}})[0]["gpu.pcie"]
    assert r.status == Status.OK and "expected x8" in r.reason
    p5.set_gpu(3, pcie_width_current=4)
    r = run_node(p5, ["gpu.pcie"], **{"gpu.pcie": {"expected_width": 8}})[0]["gpu.pcie"]
    assert r.status == Status.WARN and "x4, profile expects x8" in r.reason


def test_g5_and_g4dn_instances_pick_their_family_profile_expecting_x8(tmp_path: Path) -> None:
    from hpresilience.health.profiles import load_profile

    for itype, family in (("g5.12xlarge", "g5"), ("g4dn.xlarge", "g4dn"), ("m7i.large", "generic")):
        dmi = tmp_path / itype / "sys/devices/virtual/dmi/id/product_name"
        dmi.parent.mkdir(parents=True)
        dmi.write_text(itype + "\n")
        prof = load_profile(HealthSettings(profile_dirs=[]), paths=HostPaths(tmp_path / itype / "sys"))
        assert prof.name == family
        if family != "generic":
            assert prof.options["gpu.pcie"].expected_width == 8  # type: ignore[attr-defined]


def test_gpu_missing_shortly_after_boot_only_warns_until_the_grace_period_passes(p5: FakeNode) -> None:
    """HyperPod agent PR #425: after a driver upgrade NVML saw 0 GPUs and healthy nodes were rebooted."""
    p5.inject("gpu_missing")
    (p5.proc / "uptime").write_text("45.20 80.11\n")
    r = run_node(p5, ["gpu.count"])[0]["gpu.count"]
    assert (r.status, r.action) == (Status.WARN, Action.NONE) and "booted 45 s ago" in r.reason
    p5.write_nvml({"unavailable": "NVML init failed: Driver/library version mismatch"})
    r = run_node(p5, ["gpu.count"])[0]["gpu.count"]
    assert (r.status, r.action) == (Status.WARN, Action.NONE)
    (p5.proc / "uptime").write_text("4000.00 8000.00\n")
    r = run_node(p5, ["gpu.count"])[0]["gpu.count"]
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT)


def test_gpu_missing_right_after_a_driver_change_only_warns(p5: FakeNode) -> None:
    (p5.proc / "uptime").write_text("90000.0 1.0\n")
    version = p5.sys / "module/nvidia/version"
    version.parent.mkdir(parents=True)
    version.write_text("550.127.05\n")
    assert run_node(p5, ["gpu.count"])[0]["gpu.count"].status == Status.OK  # first version seen: no change
    p5.inject("gpu_missing")
    assert run_node(p5, ["gpu.count"])[0]["gpu.count"].action == Action.REBOOT
    version.write_text("570.158.01\n")
    r = run_node(p5, ["gpu.count"])[0]["gpu.count"]
    assert (r.status, r.action) == (Status.WARN, Action.NONE) and "driver changed" in r.reason
    r = run_node(p5, ["gpu.count"], **{"gpu.count": {"grace_s": 0}})[0]["gpu.count"]
    assert r.action == Action.REBOOT


def test_lost_gpu_is_still_acted_on_inside_the_grace_period(p5: FakeNode) -> None:
    (p5.proc / "uptime").write_text("30.0 1.0\n")
    p5.inject("gpu_lost:1")
    r = run_node(p5, ["gpu.count"])[0]["gpu.count"]
    assert (r.status, r.action, r.certain) == (Status.FAIL, Action.REBOOT, True)


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def _fake_pynvml(lost_on: str) -> types.ModuleType:
    """NVML as pynvml exposes it, for 2 GPUs; GPU 1 answers GPU_IS_LOST (15) to the call `lost_on`."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = _NVMLError  # type: ignore[attr-defined]
    for i, name in enumerate(
        [
            "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
            "NVML_MEMORY_ERROR_TYPE_CORRECTED",
            "NVML_VOLATILE_ECC",
            "NVML_AGGREGATE_ECC",
            "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
            "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
        ]
    ):
        setattr(nv, name, i)
    nv.NVML_ERROR_GPU_IS_LOST = 15  # type: ignore[attr-defined]
    nv.NVML_ERROR_UNKNOWN = 999  # type: ignore[attr-defined]

    def answer(name: str, value: object) -> Callable[..., object]:
        def call(*args: object) -> object:
            if args and args[0] == 1 and name == lost_on:
                raise _NVMLError(15)
            return value

        return call

    values: dict[str, Any] = {
        "nvmlInit": None,
        "nvmlShutdown": None,
        "nvmlSystemGetDriverVersion": "570.158.01",
        "nvmlDeviceGetCount": 2,
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": "GPU-00000000-0000-0000-0000-000000000001",
        "nvmlDeviceGetPciInfo": types.SimpleNamespace(busId="00000000:53:00.0"),
        "nvmlDeviceGetTotalEccErrors": 0,
        "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
        "nvmlDeviceGetRetiredPages": [],
        "nvmlDeviceGetRetiredPagesPendingStatus": 0,
        "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetCurrentClocksThrottleReasons": 1,
        "nvmlDeviceGetFieldValues": None,
        "nvmlDeviceGetRepairStatus": types.SimpleNamespace(bChannelRepairPending=0, bTpcRepairPending=1),
        "nvmlDeviceGetUnrepairableMemoryFlag_v1": types.SimpleNamespace(bUnrepairableMemory=0),
    }
    for name, value in values.items():
        setattr(nv, name, answer(name, value))
    nv.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    return nv


@pytest.mark.parametrize("lost_on", ["nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"])
def test_gpu_lost_in_the_middle_of_the_query_is_lost_not_healthy(monkeypatch: pytest.MonkeyPatch, lost_on: str) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(lost_on))
    snap = PynvmlReader().snapshot()
    assert [g.lost for g in snap.gpus] == [False, True]
    assert "15" in snap.gpus[1].error and snap.gpus[0].pcie_width_max == 16


def test_typo_in_health_nvml_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    from hpresilience.config import load_config

    for bad in ("nvidia_smi", "pynvm", "nvml.json"):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"health:\n  nvml: {bad}\n")
        with pytest.raises(ConfigError, match=r"health\.nvml"):
            load_config(cfg)
    cfg.write_text(f"health:\n  nvml: {tmp_path}/rec.json\n")
    assert load_config(cfg).health.nvml.endswith("rec.json")


def test_nvml_repair_status_and_unrepairable_flag_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(lost_on="none"))
    g = PynvmlReader().snapshot().gpus[0]
    assert (g.channel_repair_pending, g.tpc_repair_pending, g.unrepairable_memory) == (False, True, False)
    nv = _fake_pynvml(lost_on="none")
    del nv.nvmlDeviceGetRepairStatus  # an older NVML without the call: unknown, not "no repair pending"
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    assert PynvmlReader().snapshot().gpus[0].tpc_repair_pending is None
