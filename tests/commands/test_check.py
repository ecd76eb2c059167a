"""`hpresilience check`: table / JSON, exit status, path flags, on this machine and on a fake faulty node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpresilience.cli import main
from hpresilience.testing.fakenode import FakeNode


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(list(args))
    return rc, capsys.readouterr().out


def test_on_this_gpu_less_machine_accelerators_are_not_applicable_and_system_passes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The acceptance check: GPU/Neuron/EFA not applicable, CPU and system passed, exit 0."""
    rc, out = run(capsys, "--json", "check", "--profile", "generic", "--state-dir", str(tmp_path))
    data = json.loads(out)
    status = {r["check"]: r["status"] for r in data["results"]}
    assert rc == 0 and data["verdict"]["status"] == "ok"
    for name in ("system.cpu", "system.memory", "system.disk", "system.mounts"):
        assert status[name] == "ok", data
    for name, st in status.items():
        if name.split(".")[0] in ("gpu", "neuron", "efa", "dcgm"):
            assert st == "not_applicable", (name, data)


def test_table_output_and_exit_1_on_a_faulty_fake_node(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    node = FakeNode.make(tmp_path / "n1", "p5.48xlarge")
    rc, out = run(capsys, "--config", str(node.root / "config.yaml"), "check")
    assert rc == 0 and "profile p5.48xlarge: OK" in out and "gpu.count" in out
    node.inject("remap_failure:0")
    rc, out = run(capsys, "--config", str(node.root / "config.yaml"), "check")
    assert rc == 1
    line = next(ln for ln in out.splitlines() if ln.startswith("gpu.memory"))
    assert "fail" in line and "replace" in line and "FAIL (action replace)" in out


def test_json_spells_actions_in_lower_case_and_lists_each_finding(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The JSON shape scripts read: "action" is "none"/"reboot"/"replace", at the verdict, per result and per
    finding in a result's evidence ({"what", "action", "key", ...details})."""
    node = FakeNode.make(tmp_path / "n1", "p5.48xlarge")
    node.inject("remap_failure:0")
    rc, out = run(capsys, "--json", "--config", str(node.root / "config.yaml"), "check")
    data = json.loads(out)
    assert rc == 1 and data["verdict"]["action"] == "replace"
    mem = next(r for r in data["results"] if r["check"] == "gpu.memory")
    assert (mem["status"], mem["action"]) == ("fail", "replace")
    [finding] = mem["evidence"]["findings"]
    assert finding["action"] == "replace" and finding["gpu"] == 0
    assert finding["what"] == mem["reason"] and finding["key"] == mem["key"]
    assert {r["action"] for r in data["results"] if r["check"] != "gpu.memory"} <= {"none"}


def test_path_flags_redirect_hardware_reads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    node = FakeNode.make(tmp_path / "trn", "trn1.32xlarge")
    rc, out = run(
        capsys,
        "--json",
        "check",
        "--profile",
        "trn1.32xlarge",
        "--path.sysfs",
        str(node.sys),
        "--path.procfs",
        str(node.proc),
        "--path.dev",
        str(node.dev),
        "--state-dir",
        str(tmp_path / "s"),
        "--check",
        "neuron.count",
        "--check",
        "efa.devices",
        "--check",
        "system.cpu",
    )
    data = json.loads(out)
    assert rc == 0, data
    got = {r["check"]: r for r in data["results"]}
    assert got["neuron.count"]["evidence"]["found"] == 16 and got["efa.devices"]["evidence"]["found"] == 8
    assert got["system.cpu"]["evidence"]["online"] == 128


def test_unknown_check_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", "--check", "gpu.nope"])
    assert rc == 2 and "unknown check 'gpu.nope'" in capsys.readouterr().err


@pytest.mark.parametrize("fault", ["gpu_missing", "nvml_broken"])
def test_strict_applies_no_post_boot_grace_so_a_missing_gpu_or_broken_nvml_fails(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fault: str
) -> None:
    """The health gate runs `check --active --strict` as soon as a repaired node registers, i.e. inside the
    300 s post-boot grace: there a missing GPU only warns, and the node was resumed short of GPUs."""
    node = FakeNode.make(tmp_path / "n1", "p5.48xlarge")
    (node.proc / "uptime").write_text("45.20 80.11\n")
    if fault == "gpu_missing":
        node.inject("gpu_missing")
    else:
        node.write_nvml({"unavailable": "NVML init failed: Driver/library version mismatch"})
    cfg = str(node.root / "config.yaml")
    rc, out = run(capsys, "--config", cfg, "check", "--check", "gpu.count")
    assert rc == 0 and "booted 45 s ago" in out
    rc, out = run(capsys, "--config", cfg, "check", "--check", "gpu.count", "--strict")
    line = next(ln for ln in out.splitlines() if ln.startswith("gpu.count"))
    assert rc == 1 and "fail" in line and "reboot" in line and "grace" not in line
