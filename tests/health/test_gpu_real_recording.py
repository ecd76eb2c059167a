"""The GPU checks on what a real H100 printed (driver 580.159.04, recorded with tests/fixtures/health/record_nvml.py).

Both sources were read from the same GPU within a second: NVML through our own PynvmlReader, and `nvidia-smi -q -x`
(DTD v13). The fallback must judge a machine exactly as NVML does, so the two recordings must agree field by field.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from hpresilience.health.base import Status
from hpresilience.health.nvml import RecordedReader, parse_nvidia_smi_xml
from hpresilience.reasons import Action
from hpresilience.testing.fakenode import FakeNode
from tests.health.conftest import FIXTURES, node_settings

REAL_XML = FIXTURES / "nvidia-smi-q-x-h100-real-580.xml"
REAL_NVML = FIXTURES / "nvml-h100-real-580.json"
GPU_CHECKS = ["gpu.count", "gpu.memory", "gpu.pcie", "gpu.clocks", "gpu.recovery"]
# Fields only one source can give on this driver: nvidia-smi prints the SRAM threshold flag and the recovery word;
# nvidia-ml-py 13.580's nvmlDeviceGetSramEccErrorStatus answered ArgumentVersionMismatch on the same machine, and
# NVML gives the recovery action as a number only.
ONE_SOURCE_ONLY = {"sram_threshold_exceeded", "recovery_action_text"}


def test_real_h100_nvidia_smi_xml_and_nvml_agree_on_every_judged_field() -> None:
    xml = parse_nvidia_smi_xml(REAL_XML.read_text())
    nvml = RecordedReader(REAL_NVML).snapshot()
    assert xml.driver_version == nvml.driver_version == "580.159.04"
    assert xml.count == nvml.count == 1
    a, b = asdict(xml.gpus[0]), asdict(nvml.gpus[0])
    differing = {k for k in a if a[k] != b[k]}
    assert differing <= ONE_SOURCE_ONLY, {k: (a[k], b[k]) for k in differing}
    g = xml.gpus[0]
    # Values read, not defaults: a parser that lost a path would leave None here.
    assert (g.pcie_gen_max, g.pcie_width_max, g.ecc_volatile_uncorrected, g.remapped_rows_uncorrected) == (5, 16, 0, 0)
    assert g.recovery_action == 0 and g.sram_threshold_exceeded is False and g.lost is False


def _node_with(tmp_path: Path, nvml: str, fake_tool: Callable[[str, str], str]) -> tuple[FakeNode, dict[str, str]]:
    node = FakeNode.make(tmp_path / "h100", "generic")
    shutil.copy(REAL_NVML, node.nvml_path)
    tool = fake_tool("nvidia-smi", f'[ "$1" = "-q" ] && [ "$2" = "-x" ] && exec cat {REAL_XML}\nexit 9')
    return node, {"nvml": nvml, "nvidia_smi": tool}


@pytest.mark.parametrize("source", ["recorded", "nvidia-smi"])
def test_the_real_healthy_h100_passes_every_gpu_check_from_either_source(
    tmp_path: Path, fake_tool: Callable[[str, str], str], source: str
) -> None:
    from hpresilience.health.api import run_profile

    node, tools = _node_with(tmp_path, "recorded", fake_tool)
    s = node_settings(node)
    if source == "nvidia-smi":
        s = s.model_copy(
            update={"nvml": "nvidia-smi", "commands": s.commands.model_copy(update={"nvidia_smi": tools["nvidia_smi"]})}
        )
    _, results, verdict = run_profile(s, only=GPU_CHECKS)
    assert {r.check: r.status for r in results} == dict.fromkeys(GPU_CHECKS, Status.OK)
    assert verdict.action == Action.NONE
    count = next(r for r in results if r.check == "gpu.count")
    assert count.evidence["count"] == 1 and count.evidence["driver"] == "580.159.04"


def test_one_uncorrectable_error_flipped_into_the_real_recording_fails_the_memory_check_from_either_source(
    tmp_path: Path, fake_tool: Callable[[str, str], str]
) -> None:
    from hpresilience.health.api import run_profile

    node, _ = _node_with(tmp_path, "recorded", fake_tool)
    data = json.loads(REAL_NVML.read_text())
    data["gpus"][0]["ecc_volatile_uncorrected"] = 1
    node.write_nvml(data)
    xml = tmp_path / "flipped.xml"
    xml.write_text(
        REAL_XML.read_text().replace(
            "<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>1</dram_uncorrectable>", 1
        )
    )
    smi = fake_tool("nvidia-smi", f'[ "$1" = "-q" ] && [ "$2" = "-x" ] && exec cat {xml}\nexit 9')
    s = node_settings(node)
    from_nvml = run_profile(s, only=["gpu.memory"])[1][0]
    s = s.model_copy(update={"nvml": "nvidia-smi", "commands": s.commands.model_copy(update={"nvidia_smi": smi})})
    from_smi = run_profile(s, only=["gpu.memory"])[1][0]
    for r in (from_nvml, from_smi):
        assert r.status == Status.FAIL and r.action != Action.NONE, r
    assert from_nvml.reason == from_smi.reason
