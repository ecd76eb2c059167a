"""GPU checks over recorded NVML snapshots and recorded `nvidia-smi -q -x` XML."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hpresilience.health.base import Status, SuggestedAction
from hpresilience.health.fault import FakeNode
from hpresilience.health.nvml import NvmlUnavailable, PynvmlReader, parse_nvidia_smi_xml
from tests.health.conftest import FIXTURES, run_node

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
        .replace(
            "<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>3</dram_uncorrectable>", 1
        )
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
    s = s.model_copy(
        update={"nvml": "nvidia-smi", "commands": s.commands.model_copy(update={"nvidia_smi": tool})}
    )
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
    assert (r.status, r.action, r.certain) == (Status.FAIL, SuggestedAction.REPLACE, True)
    assert r.key == "gpu.remap_failure:0000:86:00"


def test_remap_pending_reboots_then_replaces_when_it_survives_reboots(p5: FakeNode) -> None:
    seen = []
    for _ in range(3):
        p5.inject("remap_pending:1")
        seen.append(run_node(p5, ["gpu.memory"])[0]["gpu.memory"].action)
        p5.reboot()
    assert seen == [SuggestedAction.REBOOT, SuggestedAction.REBOOT, SuggestedAction.REPLACE]


@pytest.mark.parametrize(
    ("unc", "limit", "status"), [(511, 512, Status.OK), (512, 512, Status.FAIL), (3, 2, Status.FAIL)]
)
def test_uncorrectable_remap_threshold(p5: FakeNode, unc: int, limit: int, status: Status) -> None:
    p5.set_gpu(0, remapped_rows_uncorrected=unc)
    r = run_node(p5, ["gpu.memory"], **{"gpu.memory": {"max_uncorrectable_remaps": limit}})[0]["gpu.memory"]
    assert r.status == status
    if status == Status.FAIL:
        assert r.action == SuggestedAction.REPLACE


@pytest.mark.parametrize(
    ("vol", "limit", "status"), [(0, 0, Status.OK), (1, 0, Status.FAIL), (5, 10, Status.OK)]
)
def test_volatile_uncorrected_ecc_threshold(p5: FakeNode, vol: int, limit: int, status: Status) -> None:
    p5.inject(f"ecc:2:{vol}")
    r = run_node(p5, ["gpu.memory"], **{"gpu.memory": {"max_volatile_uncorrected": limit}})[0]["gpu.memory"]
    assert r.status == status
    if status == Status.FAIL:
        assert r.action == SuggestedAction.REBOOT and r.evidence["findings"][0]["value"] == vol


def test_aggregate_ecc_judged_only_when_a_limit_is_set(p5: FakeNode) -> None:
    p5.set_gpu(0, ecc_aggregate_uncorrected=40)
    assert run_node(p5, ["gpu.memory"])[0]["gpu.memory"].status == Status.OK
    r = run_node(p5, ["gpu.memory"], **{"gpu.memory": {"max_aggregate_uncorrected": 10}})[0]["gpu.memory"]
    assert r.action == SuggestedAction.REPLACE


def test_retired_pages_at_the_limit_replace(p5: FakeNode) -> None:
    p5.set_gpu(4, retired_pages_sbe=40, retired_pages_dbe=20, retired_pages_pending=False)
    r = run_node(p5, ["gpu.memory"])[0]["gpu.memory"]
    assert r.action == SuggestedAction.REPLACE and "60 retired pages" in r.reason


def test_pcie_width_below_max_warns_and_generation_only_when_asked(p5: FakeNode) -> None:
    p5.set_gpu(5, pcie_gen_current=1)
    assert run_node(p5, ["gpu.pcie"])[0]["gpu.pcie"].status == Status.OK  # gen drops at idle: not judged
    assert (
        run_node(p5, ["gpu.pcie"], **{"gpu.pcie": {"check_generation": True}})[0]["gpu.pcie"].status
        == Status.WARN
    )
    p5.set_gpu(5, pcie_gen_current=5, pcie_width_current=8)
    r = run_node(p5, ["gpu.pcie"])[0]["gpu.pcie"]
    assert (r.status, r.action) == (Status.WARN, SuggestedAction.NONE) and "x8, max x16" in r.reason


def test_hw_thermal_and_power_brake_slowdown_warn_sw_power_cap_does_not(p5: FakeNode) -> None:
    p5.set_gpu(0, clock_event_reasons=0x1 | 0x4)
    assert run_node(p5, ["gpu.clocks"])[0]["gpu.clocks"].status == Status.OK
    p5.set_gpu(0, clock_event_reasons=0x80)
    r = run_node(p5, ["gpu.clocks"])[0]["gpu.clocks"]
    assert r.status == Status.WARN and "hw_power_brake_slowdown" in r.reason


@pytest.mark.parametrize(
    ("value", "status", "action"),
    [
        (0, Status.OK, SuggestedAction.NONE),
        (2, Status.FAIL, SuggestedAction.REBOOT),
        (4, Status.FAIL, SuggestedAction.REBOOT),
        (5, Status.WARN, SuggestedAction.NONE),
        (None, Status.OK, SuggestedAction.NONE),
    ],
)
def test_driver_recovery_action_field(
    p5: FakeNode, value: int | None, status: Status, action: SuggestedAction
) -> None:
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
    assert (r.status, r.action, r.certain) == (Status.FAIL, SuggestedAction.REBOOT, False)


def test_nvml_unusable_with_gpus_on_pci_fails_count_and_is_unknown_elsewhere(p5: FakeNode) -> None:
    p5.write_nvml({"unavailable": "NVML init failed: Driver Not Loaded"})
    res = run_node(p5, ["gpu.count", "gpu.memory"])[0]
    assert res["gpu.count"].status == Status.FAIL and "8 NVIDIA GPU(s) on PCI" in res["gpu.count"].reason
    assert res["gpu.memory"].status == Status.UNKNOWN and res["gpu.memory"].action == SuggestedAction.NONE


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
    assert "8 NVIDIA GPUs on PCI, NVML sees 7" in whats and r.action == SuggestedAction.REBOOT
