"""Issue 31 point 1: any user can put text into the kernel log through the name of a program that crashes.

The kernel's segfault report prints the program's name (`comm`, 15 bytes) and the mapped file's name (up to
255 bytes) raw, newlines included: one record, whose further lines /dev/kmsg shows as `\\x0a`, `dmesg` and
`journalctl` indent, and `dmesg -S` or a syslog file fed from /proc/kmsg prefix with the record's own stamp.
A name like `u<newline>NVRM: Xid (PCI:0000:53:00): 79, ...` made `check --check xid` answer reboot, and a
`NEURON_HW_ERR=...` one replace. The fixtures `*-forged-names.txt` were recorded on a 6.18 kernel from six
such names run as `nobody` (tests/fixtures/health/README.md); the last two tests crash such a binary for real
where this kernel lets the test read what it printed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpresilience.cli import main
from hpresilience.health.base import Status
from hpresilience.health.events import KernelLogFollower
from hpresilience.health.xid import parse_lines
from hpresilience.reasons import Action
from hpresilience.testing.fakenode import FakeNode
from tests.health.conftest import FIXTURES, run_node

SHAPES = [
    "kmsg-forged-names.txt",  # /dev/kmsg: one record per line, its newlines as \x0a
    "dmesg-forged-names.txt",  # dmesg (and -T, --time-format iso): further lines indented
    "dmesg-S-forged-names.txt",  # dmesg -S (syslog(2)): every line with the record's own stamp
    "kern-log-forged-names.txt",  # rsyslog from /proc/kmsg: the same, behind a syslog header
    "journal-forged-names.txt",  # journalctl -k: further lines indented to the message column
]
# Driver 570's one-record off-the-bus report, in the shapes where its lines are not the first of the record.
REAL_OFF_BUS = {
    "kmsg": [
        "3,7,2211730512,-;NVRM: The NVIDIA GPU 0000:c4:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this "
        "system has\\x0aNVRM: fallen off the bus and is not responding to commands."
    ],
    "dmesg-S": [
        "[ 2211.730512] NVRM: The NVIDIA GPU 0000:c4:00.0",
        "[ 2211.730512] NVRM: (PCI ID: 10de:2330) installed in this system has",
        "[ 2211.730512] NVRM: fallen off the bus and is not responding to commands.",
    ],
    "kern-log": [
        "Nov 28 00:22:44 node7 kernel: [ 2211.730512] NVRM: The NVIDIA GPU 0000:c4:00.0",
        "Nov 28 00:22:44 node7 kernel: [ 2211.730512] NVRM: (PCI ID: 10de:2330) installed in this system has",
        "Nov 28 00:22:44 node7 kernel: [ 2211.730512] NVRM: fallen off the bus and is not responding to commands.",
    ],
    "journal": [
        "Nov 28 00:22:44 node7 kernel: NVRM: The NVIDIA GPU 0000:c4:00.0",
        "                              NVRM: (PCI ID: 10de:2330) installed in this system has",
        "                              NVRM: fallen off the bus and is not responding to commands.",
    ],
}


def check_xid(capsys: pytest.CaptureFixture[str], node: FakeNode, kernel_log: Path) -> tuple[int, dict[str, Any]]:
    """`hpresilience --json check --check xid --kernel-log PATH` on the node; (exit status, the xid result)."""
    config = str(node.root / "config.yaml")
    rc = main(["--json", "--config", config, "check", "--check", "xid", "--kernel-log", str(kernel_log)])
    data = json.loads(capsys.readouterr().out)
    [result] = [r for r in data["results"] if r["check"] == "xid"]
    return rc, result


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("instance", ["p5.48xlarge", "trn1.32xlarge"])
def test_forged_driver_messages_in_crashing_program_names_pass_the_xid_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, shape: str, instance: str
) -> None:
    """Each shape holds the six forgeries (XID 79, NEURON_HW_ERR, an SXid, an XID 48 behind a name that itself
    starts with `NVRM: `, a literal backslash-x0a that dmesg prints unescaped, a whole off-the-bus report):
    before, `reboot` on the GPU node and `replace` on the Trainium one."""
    node = FakeNode.make(tmp_path / "n", instance, efa=1)
    rc, r = check_xid(capsys, node, FIXTURES / shape)
    assert (rc, r["status"], r["action"]) == (0, "ok", "none"), r
    assert r["evidence"]["findings"] == [], r


@pytest.mark.parametrize("sep", ["\u0085", "\u2028", "\u2029", "\x1c", "\x1e", "\x0b", "\x0c"])
def test_a_line_separator_other_than_newline_in_a_name_splits_no_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, sep: str
) -> None:
    """The kernel prints a name's bytes raw to /proc/kmsg, and a syslog daemon that does not escape them
    writes them through; str.splitlines() (the file reader's, before) broke the line at each of these."""
    node = FakeNode.make(tmp_path / "p5", "p5.48xlarge", efa=1)
    log = tmp_path / "kern.log"
    log.write_text(
        f"Nov 28 00:22:44 node7 kernel: [  376.670360] u{sep}NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.[1139,563ff428a000+1000] likely on CPU 0 (core 0, socket 0)\n"
    )
    rc, r = check_xid(capsys, node, log)
    assert (rc, r["status"], r["action"]) == (0, "ok", "none"), r


@pytest.mark.parametrize("shape", SHAPES)
def test_no_line_of_a_forged_record_parses_as_a_fault(shape: str) -> None:
    assert parse_lines((FIXTURES / shape).read_text().split("\n")) == []


@pytest.mark.parametrize("shape", SHAPES)
def test_a_real_fault_after_the_forged_records_still_counts_once(tmp_path: Path, shape: str) -> None:
    """The driver's own record that follows (in the file's own shape) is read, and nothing of the forgeries."""
    text = (FIXTURES / shape).read_text()
    real = {
        "kmsg": "3,900,380000000,-;NVRM: Xid (PCI:0000:64:00): 48, pid='<unknown>', name=<unknown>, DBE",
        "dmesg": "[  380.000000] NVRM: Xid (PCI:0000:64:00): 48, pid='<unknown>', name=<unknown>, DBE",
        "kern": "Nov 28 00:22:48 node7 kernel: [  380.000000] NVRM: Xid (PCI:0000:64:00): 48, pid=1, name=x, DBE",
        "journal": "Nov 28 00:22:48 node7 kernel: NVRM: Xid (PCI:0000:64:00): 48, pid='<unknown>', name=x, DBE",
    }[shape.split("-")[0]]
    node = FakeNode.make(tmp_path / "p5", "p5.48xlarge", efa=1)
    node.kmsg.write_text(text + real + "\n")
    r = run_node(node, ["xid"])[0]["xid"]
    assert (r.status, r.action, r.key) == (Status.FAIL, Action.REBOOT, "nvidia:48:0000:64:00"), r.reason
    assert [f["key"] for f in r.evidence["findings"]] == ["nvidia:48:0000:64:00"]


@pytest.mark.parametrize("shape", sorted(REAL_OFF_BUS))
def test_the_drivers_own_multi_line_off_the_bus_report_still_counts(shape: str) -> None:
    [ev] = parse_lines(REAL_OFF_BUS[shape])
    assert (ev.vendor, ev.code, ev.device) == ("nvidia", "79", "0000:c4:00")


def test_a_record_that_shares_a_stamp_with_a_driver_record_is_still_read() -> None:
    """Two driver records of the same microsecond in a prefix-per-line shape are two records, both read."""
    evs = parse_lines(
        [
            "[  380.000000] NVRM: Xid (PCI:0000:64:00): 48, pid='<unknown>', name=<unknown>, DBE",
            "[  380.000000] NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', name=<unknown>, off the bus",
        ]
    )
    assert [(e.code, e.device) for e in evs] == [("48", "0000:64:00"), ("79", "0000:97:00")]


# -- a real crashing binary ---------------------------------------------------------------------------------
SEGV_C = "int main(void) { volatile int *p = 0; return *p; }\n"
FORGED_79 = "NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@pytest.fixture()
def crashing_binary() -> Iterator[Path]:
    """A tiny program that faults in its own code (so the kernel names its file), in a directory `nobody` can
    execute from; skipped where there is no C compiler or the test cannot read /dev/kmsg."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the crashing program")
    try:
        _kmsg_records()
    except OSError as err:
        pytest.skip(f"this kernel does not let the test read /dev/kmsg: {err}")
    with tempfile.TemporaryDirectory(prefix="hpr-segv-") as d:
        os.chmod(d, 0o755)
        src = Path(d) / "segv.c"
        src.write_text(SEGV_C)
        exe = Path(d) / "segv"
        subprocess.run([cc, "-O0", "-o", str(exe), str(src)], check=True, timeout=60, capture_output=True)
        yield exe


def _kmsg_records() -> list[str]:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    out = []
    try:
        while True:
            try:
                out.append(os.read(fd, 8192).decode("utf-8", "replace").rstrip("\n"))
            except BlockingIOError:
                return out
            except BrokenPipeError:  # records overwritten under us: the next read goes on
                continue
    finally:
        os.close(fd)


def _crash_as_a_user(binary: Path, forged: str) -> str:
    """Run a copy of `binary` named `<marker><newline><forged>` as `nobody` (where we are root); the marker."""
    marker = f"hpr{secrets.token_hex(3)}"
    named = binary.with_name(f"{marker}\n{forged}")
    shutil.copy(binary, named)
    os.chmod(named, 0o755)
    user = 65534 if os.geteuid() == 0 else None
    res = subprocess.run([str(named)], user=user, cwd=named.parent, timeout=30, capture_output=True)
    assert res.returncode == -11, res
    if not any(marker in r for r in _kmsg_records()):
        pytest.skip("the kernel printed no segfault report (debug.exception-trace off, or rate-limited)")
    return marker


def test_a_real_segfault_under_a_forged_name_is_no_fault_in_any_shape(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, crashing_binary: Path
) -> None:
    """What this kernel printed for it (kmsg, and dmesg and dmesg -S where there is dmesg) through the CLI."""
    marker = _crash_as_a_user(crashing_binary, FORGED_79)
    logs = {"kmsg": [r for r in _kmsg_records() if marker in r]}
    assert FORGED_79 in logs["kmsg"][0].replace("\\x0a", "\n")
    for name, args in (("dmesg", []), ("dmesg-S", ["-S"])):
        dmesg = shutil.which("dmesg")
        out = subprocess.run([dmesg, *args], capture_output=True, text=True, timeout=30) if dmesg else None
        lines = out.stdout.split("\n") if out and out.returncode == 0 else []
        at = [i for i, ln in enumerate(lines) if ln.endswith(marker)]
        if at:
            logs[name] = lines[at[0] : at[0] + 3]  # the record's three lines as this shape prints them
    node = FakeNode.make(tmp_path / "p5", "p5.48xlarge", efa=1)
    for name, lines in logs.items():
        path = tmp_path / f"{name}.log"
        path.write_text("\n".join(lines) + "\n")
        rc, r = check_xid(capsys, node, path)
        assert (rc, r["status"], r["action"]) == (0, "ok", "none"), (name, lines, r)


def test_the_agents_follower_on_dev_kmsg_sees_no_fault_in_a_real_forged_segfault(crashing_binary: Path) -> None:
    """The agent's event source reads /dev/kmsg itself (a character device: one record per read)."""
    follower = KernelLogFollower("/dev/kmsg")  # from the end: only what comes now
    try:
        assert follower.kmsg
        _crash_as_a_user(crashing_binary, FORGED_79)
        _crash_as_a_user(crashing_binary, "NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR nd-id=3 action=TERMINATE_INSTANCE")
        assert follower.poll(0.5) == []
    finally:
        follower.close()
