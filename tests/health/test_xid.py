"""XID catalogue, kernel-log parsing, the XID check, and reboot-then-replace escalation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hpresilience.errors import ConfigError
from hpresilience.health.base import Status
from hpresilience.health.escalation import EscalationStore
from hpresilience.health.xid import CATALOG_PATH, FaultEvent, load_catalog, parse_line, parse_lines
from hpresilience.reasons import Action
from hpresilience.testing.fakenode import FakeNode
from tests.health.conftest import FIXTURES, run_node

RAW: dict[str, Any] = yaml.safe_load(CATALOG_PATH.read_text())


@pytest.mark.parametrize("xid", sorted(RAW["nvidia"], key=lambda x: int(str(x))))
def test_every_catalogued_xid_classifies_to_its_table_action(xid: int) -> None:
    cat = load_catalog()
    assert cat.action_for(int(xid)) == RAW["nvidia"][xid]["action"]


@pytest.mark.parametrize(
    ("xid", "action"),
    [
        (13, "none"),
        (31, "none"),
        (43, "none"),
        (94, "none"),
        (48, "reboot_then_replace"),
        (79, "reboot_then_replace"),
        (54, "replace"),
        (64, "replace"),
        (46, "reboot"),
        (63, "warn"),
        (92, "warn"),
    ],
)
def test_key_xids_follow_the_consolidated_table(xid: int, action: str) -> None:
    assert load_catalog().action_for(xid) == action


def test_unlisted_xid_gets_the_default_action_and_overrides_win() -> None:
    assert load_catalog().action_for(9999) == RAW["default_action"]
    cat = load_catalog({13: "replace", 79: "none"})
    assert cat.action_for(13) == "replace" and cat.action_for(79) == "none" and cat.action_for(48) != "none"


def test_override_with_an_unknown_action_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"xid_overrides\.13"):
        load_catalog({13: "explode"})


def test_neuron_hw_errors_are_all_actionable() -> None:
    cat = load_catalog()
    for code in RAW["neuron"]:
        assert cat.classify(FaultEvent("neuron", code, "nd0", "")).action in (
            "replace",
            "reboot_then_replace",
        )


@pytest.mark.parametrize(
    ("line", "vendor", "code", "device"),
    [
        (
            "4,1391,91002003017,-;NVRM: Xid (PCI:0000:97:00): 48, pid='<unknown>', name=<unknown>, DBE",
            "nvidia",
            "48",
            "0000:97:00",
        ),
        (
            "[ 8820.114559] NVRM: Xid (PCI:0000:b9:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen",
            "nvidia",
            "79",
            "0000:b9:00",
        ),
        (
            "Nov 23 02:23:01 ip-10-0-0-1 kernel: NVRM: Xid (PCI:0000:53:00.0): 119, pid=1, GSP RPC timeout",
            "nvidia",
            "119",
            "0000:53:00",
        ),
        ("[ 8820.114563] NVRM: GPU 0000:b9:00.0: GPU has fallen off the bus.", "nvidia", "79", "0000:b9:00"),
        (
            "3,1393,91500112040,-;NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR instance-id=i-1 hostname=h nd-id=3 "
            "serial-num=x action=TERMINATE_INSTANCE",
            "neuron",
            "HBM_UNCORRECTABLE_ERROR",
            "nd3",
        ),
    ],
)
def test_fault_lines_parse_in_kmsg_dmesg_and_journal_shapes(line: str, vendor: str, code: str, device: str) -> None:
    ev = parse_line(line)
    assert ev is not None and (ev.vendor, ev.code, ev.device) == (vendor, code, device)


@pytest.mark.parametrize(
    "line",
    [
        "",
        " SUBSYSTEM=pci",
        "6,1,2,-;usb 1-1: new high-speed USB device",
        "NVRM: Xid (PCI:zz): notanumber",
        "x" * 100_000 + "NVRM: Xid (PCI:0000:01:00): 79",
        "\x00\xff;;;NEURON_HW_ERR=",
        "4,1,2,-;NVRM: Xid (PCI:0000:53:00): 999999999, x",
    ],
)
def test_garbage_and_hostile_lines_are_not_faults_and_never_raise(line: str) -> None:
    assert parse_line(line) is None


def test_xid_check_reads_recorded_kmsg_ignores_app_xids_and_acts_on_the_worst(p5: FakeNode) -> None:
    p5.kmsg.write_text((FIXTURES / "kmsg-faults.txt").read_text())
    res, _ = run_node(p5, ["xid"])
    r = res["xid"]
    assert r.status == Status.FAIL and r.certain
    # SRAM uncorrectable on a Neuron device is a replace; XID 48 alone would be a reboot.
    assert r.action == Action.REPLACE and "NEURON_HW_ERR=SRAM" in r.reason
    whats = {f["key"]: f["catalog_action"] for f in r.evidence["findings"]}
    assert whats["nvidia:13:0000:53:00"] == "none" and whats["nvidia:48:0000:97:00"] == "reboot_then_replace"


def test_xid_check_reads_dmesg_format_and_counts_fallen_off_bus_once(p5: FakeNode) -> None:
    p5.kmsg.write_text((FIXTURES / "dmesg-fallen-off-bus.txt").read_text())
    r = run_node(p5, ["xid"])[0]["xid"]
    assert r.status == Status.FAIL and r.action == Action.REBOOT
    assert [f["key"] for f in r.evidence["findings"]] == ["nvidia:79:0000:b9:00"]


def test_only_application_xids_pass_with_a_note(p5: FakeNode) -> None:
    p5.inject("xid:13:0")
    p5.inject("xid:43:1")
    r = run_node(p5, ["xid"])[0]["xid"]
    assert r.status == Status.OK and "2 application-level" in r.reason


def test_warn_xid_warns_without_action(p5: FakeNode) -> None:
    p5.inject("xid:92:0")
    r = run_node(p5, ["xid"])[0]["xid"]
    assert r.status == Status.WARN and r.action == Action.NONE


def test_xid_override_from_config_changes_the_verdict(p5: FakeNode) -> None:
    from hpresilience.health.api import run_profile
    from tests.health.conftest import node_settings

    p5.inject("xid:13:0")
    s = node_settings(p5).model_copy(update={"xid_overrides": {13: "replace"}})
    _, results, verdict = run_profile(s, only=["xid"])
    assert verdict.action == Action.REPLACE and results[0].status == Status.FAIL


def test_same_xid_returning_after_two_reboots_escalates_to_replace(p5: FakeNode) -> None:
    actions = []
    for _ in range(3):
        p5.inject("xid:79:2")
        r = run_node(p5, ["xid"])[0]["xid"]
        actions.append((r.action, r.evidence["findings"][0]["boots_seen"]))
        # Seen again in the same boot: still counted once.
        assert run_node(p5, ["xid"])[0]["xid"].action == r.action
        p5.reboot()
    assert actions == [(Action.REBOOT, 1), (Action.REBOOT, 2), (Action.REPLACE, 3)]
    # A clean boot reports nothing.
    assert run_node(p5, ["xid"])[0]["xid"].status == Status.OK


def test_escalation_is_per_device_and_forgets_outside_the_window(tmp_path: Path) -> None:
    store = EscalationStore(tmp_path / "e.json", reboots_before_replace=1, window_s=100)
    assert store.escalate("a", "boot1", now=0)[0] == Action.REBOOT
    assert store.escalate("b", "boot2", now=10)[0] == Action.REBOOT
    assert store.escalate("a", "boot2", now=10)[0] == Action.REPLACE
    assert store.escalate("b", "boot3", now=500)[0] == Action.REBOOT  # boot2 sighting expired


def test_corrupt_escalation_file_is_treated_as_empty(tmp_path: Path) -> None:
    p = tmp_path / "e.json"
    p.write_text("{not json")
    assert EscalationStore(p).escalate("k", "b1") == (Action.REBOOT, 1)


# -- issue 13: what real recordings showed ----------------------------------------------------------------
@pytest.mark.parametrize("fixture", ["dmesg-fallen-off-bus-570.txt", "kmsg-fallen-off-bus-570.txt"])
def test_fallen_off_bus_split_over_three_records_without_an_xid_is_xid79(p5: FakeNode, fixture: str) -> None:
    """Driver 570 prints 'The NVIDIA GPU <pci>' / '... installed in this system has' / 'fallen off the bus'."""
    p5.kmsg.write_text((FIXTURES / fixture).read_text())
    r = run_node(p5, ["xid"])[0]["xid"]
    assert (r.status, r.action, r.key) == (Status.FAIL, Action.REBOOT, "nvidia:79:0000:c4:00")


def test_fallen_off_bus_in_one_kmsg_record_with_escaped_newlines_is_xid79() -> None:
    line = (
        "3,7,8,-;NVRM: The NVIDIA GPU 0000:c4:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this system "
        "has\\x0aNVRM: fallen off the bus and is not responding to commands."
    )
    ev = parse_line(line)
    assert ev is not None and (ev.code, ev.device) == ("79", "0000:c4:00")


def test_one_kmsg_read_with_the_records_dictionary_lines_still_reads_the_fault() -> None:
    """A read of /dev/kmsg returns the record and its " KEY=value" lines in one string; the whole string
    failed the record pattern, so the fault in it was dropped."""
    read = "4,1391,91002003017,-;NVRM: Xid (PCI:0000:97:00): 48, pid=1, name=x, DBE\n SUBSYSTEM=pci\n DEVICE=+pci:0"
    ev = parse_line(read)
    assert ev is not None and (ev.code, ev.device, ev.timestamp) == ("48", "0000:97:00", 91002.003017)


def test_off_bus_tail_without_its_head_is_not_a_fault() -> None:
    assert parse_lines(["[ 1.0] NVRM: fallen off the bus and is not responding to commands."]) == []


def test_nvlink5_nonfatal_xids_warn_and_a_fatal_one_follows_the_catalogue(p5: FakeNode) -> None:
    p5.kmsg.write_text((FIXTURES / "kmsg-nvlink5-sxid.txt").read_text().splitlines()[0] + "\n")
    r = run_node(p5, ["xid"])[0]["xid"]
    assert (r.status, r.action) == (Status.WARN, Action.NONE) and "144 nonfatal" in r.reason
    p5.kmsg.write_text("".join((FIXTURES / "kmsg-nvlink5-sxid.txt").read_text().splitlines(True)[:3]))
    r = run_node(p5, ["xid"])[0]["xid"]
    assert (r.status, r.action, r.key) == (Status.FAIL, Action.REBOOT, "nvidia:149:000a:01:00")
    levels = {f["key"]: f["catalog_action"] for f in r.evidence["findings"]}
    assert levels["nvidia:145:0009:01:00:nonfatal"] == "warn"


def test_sxid_lines_parse_with_their_severity() -> None:
    evs = parse_lines((FIXTURES / "kmsg-nvlink5-sxid.txt").read_text().splitlines())
    sx = [(e.vendor, e.code, e.device, e.severity) for e in evs if e.vendor == "nvswitch"]
    assert sx == [("nvswitch", "19084", "0000:c3:00", "nonfatal"), ("nvswitch", "20034", "0000:c5:00", "fatal")]
    cat = load_catalog()
    assert [cat.classify(e).action for e in evs if e.vendor == "nvswitch"] == ["warn", "reboot_then_replace"]
    unlisted = parse_line("nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 12028, Fatal, Link 47 egress error")
    assert unlisted is not None and cat.classify(unlisted).action == RAW["nvswitch_default"]["fatal"]


def test_fatal_sxid_fails_the_xid_check_with_a_reboot(p5: FakeNode) -> None:
    p5.kmsg.write_text((FIXTURES / "kmsg-nvlink5-sxid.txt").read_text().splitlines()[4] + "\n")
    r = run_node(p5, ["xid"])[0]["xid"]
    assert (r.status, r.action, r.key) == (Status.FAIL, Action.REBOOT, "nvswitch:20034:0000:c5:00")
    assert "SXid 20034 fatal" in r.reason


# -- issue 14 item 12: fault patterns anchored on the driver's own prefix ---------------------------------
ATTACK = (
    "5,4002,6100000002,-;audit: type=1326 audit(1764031201.007:319): auid=1001 uid=1001 gid=1001 ses=4 "
    'pid=77121 comm="x" exe="/home/u/NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR" sig=31 arch=c000003e '
    "syscall=39 compat=0 ip=0x401000 code=0x0"
)


def test_audit_record_quoting_a_neuron_code_is_not_a_fault() -> None:
    """The exact attack: an unprivileged user's exe path made the agent mark a Trainium node Replace."""
    assert parse_line(ATTACK) is None
    assert parse_line(ATTACK.split(";", 1)[1]) is None  # the same record as dmesg prints it


def test_hostile_kernel_log_leaves_a_trainium_node_healthy(tmp_path: Path) -> None:
    node = FakeNode.make(tmp_path / "trn1", "trn1.32xlarge", efa=1)
    node.kmsg.write_text((FIXTURES / "kmsg-hostile.txt").read_text())
    r = run_node(node, ["xid"])[0]["xid"]
    assert (r.status, r.action) == (Status.OK, Action.NONE), r.reason
    node.inject("neuron_hw_err:SRAM_UNCORRECTABLE_ERROR:2")  # the driver's own line still counts
    r = run_node(node, ["xid"])[0]["xid"]
    assert (r.status, r.action, r.key) == (Status.FAIL, Action.REPLACE, "neuron:SRAM_UNCORRECTABLE_ERROR:nd2")


@pytest.mark.parametrize(
    "line",
    [
        # A user process's record written to /dev/kmsg has a user facility (prio >= 8).
        "12,4004,6100000004,-;NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, off the bus.",
        # `logger` into a syslog file: a program tag that is not the kernel's.
        "Nov 25 02:00:00 node7 user: NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x, GPU has fallen off",
        "Nov 25 02:00:00 node7 myapp[4242]: NEURON_HW_ERR=DMA_ERROR nd-id=0 action=TERMINATE_INSTANCE",
        # Quoted or key=value text before the code.
        'kernel: audit: exe="/x/NVRM: Xid (PCI:0000:53:00): 79, "',
        "kernel: foo=NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=0",
        # A 15-character comm in a segfault line cannot spell a whole code.
        "6,4006,6100000006,-;NEURON_HW_ERR=S[77122]: segfault at 0 ip 0000000000401000 error 4",
        "[ 12.5] pid 33 comm NVRM: Xid (PCI:0000:53:00): 79, x",
    ],
)
def test_fault_text_not_at_the_drivers_prefix_is_ignored(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize(
    "line",
    [
        "4,1,2,-;NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "[ 34.193759] NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off",
        "[Wed Nov 25 02:00:00 2026] NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x, GPU has fallen off",
        "2026-11-25T02:00:00,123456+00:00 NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x, off the bus",
        "kern  :err   : 2026-11-25T02:00:00,123456+00:00 NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x",
        "Nov 25 02:00:00 node7 kernel: [   34.19] NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x, off",
        "kernel: NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x, GPU has fallen off the bus.",
        "10.0.0.7: kern: warning: [2026-11-25T02:00:00.1Z]: NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x",
    ],
)
def test_every_log_prefix_shape_still_reads_the_fault(line: str) -> None:
    ev = parse_line(line)
    assert ev is not None and (ev.vendor, ev.code, ev.device) == ("nvidia", "79", "0000:53:00")
