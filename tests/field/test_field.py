"""Every hardware recording in ../shared/data/field through the real checks, with the verdict it must get.

The recordings are other people's real machines (sources in SOURCES.md there); they are read in place,
never copied into the project. Each goes in through the project's own redirection: `health.kernel_log`
for kernel logs, `health.commands.*` for tool output (a script that prints the recording), and
`health.path.sysfs` for sysfs trees. A recording added there without a row here fails the suite, so
nothing in the field goes unjudged.
"""

from __future__ import annotations

import stat
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from hpresilience.health.api import run_profile
from hpresilience.health.base import CheckResult, Status
from hpresilience.health.settings import HealthSettings
from hpresilience.reasons import Action

REPO = Path(__file__).resolve().parents[2]
FIELD = REPO.parent / "shared" / "data" / "field"

pytestmark = pytest.mark.skipif(
    not FIELD.is_dir(),
    reason=f"field recordings not found at {FIELD} (they live in the workspace's shared/data/field, "
    "beside the repository; a plain clone has none)",
)

OK, WARN, FAIL, UNKNOWN, NA = Status.OK, Status.WARN, Status.FAIL, Status.UNKNOWN, Status.NOT_APPLICABLE
NONE, REBOOT, REPLACE = Action.NONE, Action.REBOOT, Action.REPLACE

# kmsg/<file>: the `xid` check's (status, action, key of the worst finding).
KMSG: dict[str, tuple[Status, Action, str]] = {
    "akash244-dmesg-T-xid43-31-94.txt": (OK, NONE, ""),  # application XIDs only
    "gpud-dmesg-T-xid119-gsp.log": (FAIL, REBOOT, "nvidia:119:0000:9b:00"),
    "gpud-dmesg-decode-iso-xid13-storm.log": (OK, NONE, ""),
    "gpud-dmesg-iso-xid48-63-94.log": (FAIL, REBOOT, "nvidia:48:0000:19:00"),
    "gpud-kmsg-1.log": (OK, NONE, ""),
    "gpud-pr1160-xid144-nonfatal.txt": (WARN, NONE, "nvidia:144:0000:01:00:nonfatal"),
    "gpud-pr1174-gb200-kmsg-xid145-nonfatal-only.txt": (WARN, NONE, "nvidia:145:0018:01:00:nonfatal"),
    "gpud-pr1174-gb200-kmsg-xid149-145-nonfatal.txt": (FAIL, REBOOT, "nvidia:149:0019:01:00"),
    "gpud-pr46-dmesg-ctime-xid13-109.txt": (FAIL, REBOOT, "nvidia:109:0000:cb:00"),
    "gpud-pstore-dmesg-erst.txt": (OK, NONE, ""),
    "nvsentinel155-dmesg-fallen-off-bus-no-xid.txt": (FAIL, REBOOT, "nvidia:79:0000:b3:00"),
    "ogkm1150-kernel-xid45-after-145-149.txt": (OK, NONE, ""),  # XID 45 only; the 145/149 lines not pasted
    "popos3363-syslog-xid79.txt": (FAIL, REBOOT, "nvidia:79:0000:01:00"),
    "vllm40652-talos-a100-xid45-74-154.txt": (FAIL, REBOOT, "nvidia:74:0000:48:00"),
}

GPU_CHECKS = ["gpu.count", "gpu.memory", "gpu.pcie", "gpu.clocks", "gpu.recovery"]
# nvidia-smi/<file>: (profile, {check: status}) for the GPU checks; every recording is of a healthy GPU.
ALL_OK = {c: OK for c in GPU_CHECKS}
SMI: dict[str, tuple[str, dict[str, Status]]] = {
    "telegraf-3090-v13.xml": ("generic", ALL_OK),
    "telegraf-a100-sxm4-v12.xml": ("generic", ALL_OK),
    # EC2 g5 (A10G) and g4dn (T4) GPUs train at x8 of x16 when healthy: their family profile expects x8.
    "telegraf-a10g.xml": ("g5", ALL_OK),
    "telegraf-tesla-t4.xml": ("g4dn", ALL_OK),
    "telegraf-dual_a5000-v13.xml": ("generic", ALL_OK),
    "telegraf-gtx-1070-ti.xml": ("generic", ALL_OK),
    "telegraf-gtx-1660-ti.xml": ("generic", ALL_OK),
    "telegraf-pro-6000-maxq-blackwell-v13.xml": ("generic", ALL_OK),
    # A workstation card in an x8 slot: under the generic rule (the card's own maximum) that is a warning.
    "telegraf-quadro-p2000-v12.xml": ("generic", {**ALL_OK, "gpu.pcie": WARN}),
    "telegraf-quadro-p400.xml": ("generic", ALL_OK),
    "telegraf-rtx-3060-v12.xml": ("generic", ALL_OK),
    "telegraf-rtx-3080-v13.xml": ("generic", ALL_OK),
    "telegraf-rtx-3090-v12.xml": ("generic", ALL_OK),
    "telegraf-rtx-4000-sff-ada-v13.xml": ("generic", ALL_OK),
    "telegraf-tesla_p4.xml": ("generic", ALL_OK),
    "telegraf-tesla_t4.xml": ("generic", ALL_OK),
}

# dcgm/<file>: (check, how the recording is printed, status).
DCGM: dict[str, tuple[str, str, Status]] = {
    "dcgm139-diag-r3-j-all-skip.partial.json": ("dcgm.diag", "dcgmi", UNKNOWN),  # nothing was tested
    "dcgm176-health-check-watches-not-enabled.txt": ("dcgm.health", "dcgmi", UNKNOWN),
    # DCGM itself says Healthy while GPU 1 needs a reset (the point); gpu.recovery catches it below.
    "dcgm263-health-c-j-healthy-while-gpu-needs-reset.json": ("dcgm.health", "dcgmi", OK),
    "dcgm263-nvidia-smi-query-recovery-action.csv": ("gpu.recovery", "recovery-csv", FAIL),
}

EFA = {"libfabric5689-fi_info-p-efa.txt", "gpud-sys-class-infiniband-h100"}


def tool(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / "bin" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def settings(tmp_path: Path, **update: Any) -> HealthSettings:
    """A node with no hardware of its own: every read goes where `update` points."""
    root = tmp_path / "node"
    for d in ("sys", "proc", "dev", "state"):
        (root / d).mkdir(parents=True, exist_ok=True)
    base = HealthSettings(
        profile_dirs=[],
        state_dir=str(root / "state"),
        path={"sysfs": str(root / "sys"), "procfs": str(root / "proc"), "dev": str(root / "dev")},  # type: ignore[arg-type]
    )
    commands = update.pop("commands", {})
    return base.model_copy(update={**update, "commands": base.commands.model_copy(update=commands)})


def run(s: HealthSettings, profile: str, checks: list[str]) -> dict[str, CheckResult]:
    return {r.check: r for r in run_profile(s, profile, only=checks)[1]}


def test_every_recording_has_an_expected_verdict() -> None:
    listed = {
        "kmsg": set(KMSG),
        "nvidia-smi": set(SMI),
        "dcgm": set(DCGM),
        "efa": EFA,
        "neuron": set(),
    }
    for d, expected in listed.items():
        present = {p.name for p in (FIELD / d).iterdir()} if (FIELD / d).is_dir() else set()
        assert present == expected, f"{d}/: recordings without a row (or rows without a recording)"


@pytest.mark.parametrize("name", sorted(KMSG))
def test_kernel_log(tmp_path: Path, name: str) -> None:
    status, action, key = KMSG[name]
    r = run(settings(tmp_path, kernel_log=str(FIELD / "kmsg" / name)), "generic", ["xid"])["xid"]
    assert (r.status, r.action, r.key) == (status, action, key), r.reason


@pytest.mark.parametrize("name", sorted(SMI))
def test_nvidia_smi_xml(tmp_path: Path, name: str) -> None:
    profile, expected = SMI[name]
    xml = FIELD / "nvidia-smi" / name
    smi = tool(tmp_path, "nvidia-smi", f'[ "$1 $2" = "-q -x" ] && exec cat "{xml}"\nexit 9')
    s = settings(tmp_path, nvml="nvidia-smi", commands={"nvidia_smi": smi})
    res = run(s, profile, GPU_CHECKS)
    got = {c: r.status for c, r in res.items()}
    assert got == expected, {c: r.reason for c, r in res.items()}
    assert all(r.action == NONE for r in res.values())
    assert res["gpu.count"].evidence["source"] == "nvidia-smi"


def test_a10g_at_x8_warns_under_the_generic_rule(tmp_path: Path) -> None:
    """What the g5 profile is for: the generic rule (the GPU's own maximum) warns on every healthy A10G."""
    smi = tool(tmp_path, "nvidia-smi", f'exec cat "{FIELD / "nvidia-smi" / "telegraf-a10g.xml"}"')
    s = settings(tmp_path, nvml="nvidia-smi", commands={"nvidia_smi": smi})
    assert run(s, "generic", ["gpu.pcie"])["gpu.pcie"].status == WARN


def recovery_xml(csv: Path) -> str:
    """A real v13 XML with one <gpu> per CSV row, each carrying that row's gpu_recovery_action word."""
    root = ET.fromstring((FIELD / "nvidia-smi" / "telegraf-rtx-3080-v13.xml").read_text())
    template = root.findall("gpu")[0]
    for g in root.findall("gpu"):
        root.remove(g)
    for row in csv.read_text().splitlines():
        index, word = (x.strip() for x in row.split(",", 1))
        g = ET.fromstring(ET.tostring(template))
        g.set("id", f"00000000:{0x18 + int(index):02X}:00.0")
        rec = g.find("gpu_recovery_action")
        assert rec is not None
        rec.text = word
        root.append(g)
    return ET.tostring(root, encoding="unicode")


@pytest.mark.parametrize("name", sorted(DCGM))
def test_dcgm(tmp_path: Path, name: str) -> None:
    check, how, status = DCGM[name]
    path = FIELD / "dcgm" / name
    if how == "recovery-csv":
        xml = tmp_path / "smi.xml"
        xml.write_text(recovery_xml(path))
        smi = tool(tmp_path, "nvidia-smi", f'exec cat "{xml}"')
        s = settings(tmp_path, nvml="nvidia-smi", commands={"nvidia_smi": smi})
        r = run(s, "generic", [check])[check]
        assert (r.status, r.action) == (status, REBOOT) and "GPU 1" in r.reason and "gpu_reset" in r.reason
        return
    dcgmi = tool(tmp_path, "dcgmi", f'exec cat "{path}"')
    r = run(settings(tmp_path, commands={"dcgmi": dcgmi}), "generic", [check])[check]
    assert (r.status, r.action) == (status, NONE), r.reason


def test_fi_info_from_an_efa_instance(tmp_path: Path) -> None:
    fi_info = tool(tmp_path, "fi_info", f'exec cat "{FIELD / "efa" / "libfabric5689-fi_info-p-efa.txt"}"')
    s = settings(tmp_path, commands={"fi_info": fi_info})
    dev = Path(s.path.sysfs) / "class/infiniband/rdmap0s6/device"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1d0f\n")  # an EFA device of our own, so that the check applies
    r = run(s, "generic", ["efa.fi_info"])["efa.fi_info"]
    assert r.status == OK and r.evidence["endpoints"] == 3, r.reason


def test_h100_infiniband_tree(tmp_path: Path) -> None:
    """9 mlx5 HCAs (8 NDR InfiniBand + an Ethernet bond) of a real H100 node: InfiniBand, never EFA."""
    s = settings(tmp_path)
    cls = Path(s.path.sysfs) / "class"
    cls.mkdir(parents=True)
    (cls / "infiniband").symlink_to(FIELD / "efa" / "gpud-sys-class-infiniband-h100")
    checks = ["ib.ports", "ib.counters", "efa.devices", "efa.counters"]
    res = run(s, "hgx-h100-ndr", checks)
    assert res["ib.ports"].status == OK, res["ib.ports"].reason
    assert len(res["ib.ports"].evidence["ports"]) == 8
    assert res["ib.ports"].evidence["not_judged"] == {"mlx5_bond_0/1": "Ethernet"}
    assert res["efa.devices"].status == NA and res["efa.counters"].status == NA
    assert "baseline" in res["ib.counters"].reason
    # mlx5_1 carries link_downed 255 from its past: standing counts are history, a second look is clean.
    assert run(s, "hgx-h100-ndr", ["ib.counters"])["ib.counters"].status == OK
