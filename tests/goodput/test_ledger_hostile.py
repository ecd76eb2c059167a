"""Issue 31, point 4: root reads `<WorkDir>/.hpresilience/jobs/<id>.events.jsonl`, a file its job's user controls.

Each attack an ordinary user can make on the readers (the controller's /metrics collector, `hpresilience job`,
`hpresilience goodput`) reproduced: a FIFO in place of the file, a link to root's own file, a file of another
uid, numbers no float holds, escape sequences in a cause, and a file of many restarts. The tests run as root
(the job's user is `nobody`, uid 65534, and its files are chowned to it, as the wrapper would have made them).
The collector's sacct query is replaced by a list of records (the sacct parser is tested on its own)."""

from __future__ import annotations

import json
import os
import pwd
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

from hpresilience.cli import cli
from hpresilience.controller.events import EventLog
from hpresilience.goodput import ledgermetrics, ledgerread
from hpresilience.goodput.jobs import ClusterGoodput, load_ledger, render_cluster
from hpresilience.goodput.ledger import compute, render
from hpresilience.goodput.ledgermetrics import LedgerCollector
from hpresilience.slurm.accounting import JobRecord
from hpresilience.slurm.client import SlurmClient

NOBODY = pwd.getpwnam("nobody").pw_uid
T0 = 1_700_000_000.0
ESC = "\x1b]2;owned\x07\x1b[2J\x1b[31m"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns files to another uid: run as root")


def ev(t: float, event: str, **kw: Any) -> dict[str, Any]:
    return {"time": T0 + t, "event": event, **kw}


def good_events(cause: str = "hardware") -> list[dict[str, Any]]:
    return [
        ev(0, "attempt_started", attempt=1, nodes="n1,n2"),
        ev(20, "attempt_ended", attempt=1, first_step=1, last_step=10, first_progress_at=T0 + 10, step_s=1.0),
        ev(21, "fault_seen", cause=cause, nodes="n2"),
        ev(22, "old_tasks_checked"),
        ev(23, "step_relaunching"),
        ev(24, "attempt_started", attempt=2, nodes="n1,n3"),
        ev(40, "attempt_ended", attempt=2, first_step=11, last_step=20, first_progress_at=T0 + 30, step_s=1.0),
        ev(40, "job_step_succeeded"),
    ]


def job_dir(work: Path, uid: int = NOBODY) -> Path:
    d = work / ".hpresilience" / "jobs"
    d.mkdir(parents=True)
    for p in (work, work / ".hpresilience", d):
        os.chown(p, uid, uid)
    return d


def write_events(work: Path, lines: list[str], job_id: int = 7, uid: int = NOBODY) -> Path:
    d = job_dir(work, uid) if not (work / ".hpresilience" / "jobs").exists() else work / ".hpresilience" / "jobs"
    p = d / f"{job_id}.events.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    os.chown(p, uid, uid)
    return p


def record(work: Path, job_id: int = 7, user: str = "nobody") -> JobRecord:
    return JobRecord(job_id, user, "gpu", str(work), "COMPLETED", "", "")


def in_thread(fn: Any, timeout: float = 60.0) -> tuple[bool, list[Any]]:
    """Run fn on a daemon thread; (returned within `timeout`, [its result])."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive(), box


def collector_for(monkeypatch: pytest.MonkeyPatch, records: list[JobRecord], **kw: Any) -> LedgerCollector:
    monkeypatch.setattr(ledgermetrics, "finished_jobs", lambda client, window_s: records)
    # A scrape waits for the refresh it starts up to wait_s: long here, so a loaded machine changes nothing.
    return LedgerCollector(SlurmClient(), refresh_s=0, **{"wait_s": 60.0, **kw})


def scrape(c: LedgerCollector) -> str:
    reg = CollectorRegistry()
    reg.register(c)
    return generate_latest(reg).decode()


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    work = tmp_path / "fifo"
    p = job_dir(work) / "7.events.jsonl"
    os.mkfifo(p)
    os.chown(p, NOBODY, NOBODY)
    yield work
    # Free a reader the unfixed code left blocked on it (the test failed then), so the run can end: opening
    # the writing end wakes it (ENXIO: no reader, nothing to free).
    try:
        os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_a_fifo_in_place_of_the_events_file_is_refused_at_once(fifo: Path) -> None:
    returned, box = in_thread(lambda: load_ledger(record(fifo), "", now=T0))
    assert returned, "reading a FIFO ledger blocked"
    assert box == [None]


def test_a_fifo_ledger_blocks_neither_the_scrape_nor_the_next_one(
    fifo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = tmp_path / "good"
    write_events(good, [json.dumps(e) for e in good_events()], job_id=8)
    c = collector_for(monkeypatch, [record(fifo), record(good, 8)])
    first = in_thread(lambda: scrape(c))
    second = in_thread(lambda: scrape(c))
    assert first[0] and second[0], "a scrape hung on the FIFO (or waited on the one that did)"
    assert 'hpr_job_goodput_ratio{job_id="8"' in second[1][0] and 'job_id="7"' not in second[1][0]


def test_a_scrape_is_answered_from_the_last_figures_while_another_is_stuck_reading_a_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read stuck below us (a FUSE mount of the user's, a dead NFS server): the scrape that reads waits at
    most its read timeout, and a scrape arriving meanwhile does not wait at all."""
    write_events(tmp_path, [json.dumps(e) for e in good_events()])
    entered, release = threading.Event(), threading.Event()
    real_open = ledgerread.open_user_file

    def stuck_open(base: Path, parts: Any, uid: int) -> int:
        entered.set()
        release.wait(120)
        return real_open(base, parts, uid)

    c = collector_for(monkeypatch, [record(tmp_path)], read_timeout_s=600, wait_s=600)
    assert 'hpr_job_goodput_ratio{job_id="7"' in scrape(c)  # the last figures a stuck scrape leaves standing
    monkeypatch.setattr(ledgerread, "open_user_file", stuck_open)
    c.jobs[7].ledger.ended = False  # read it again
    first = threading.Thread(target=scrape, args=(c,), daemon=True)
    first.start()
    try:
        assert entered.wait(30)
        returned, box = in_thread(lambda: scrape(c))
        assert returned and first.is_alive(), "the second scrape waited for the stuck one"
        assert 'hpr_job_goodput_ratio{job_id="7"' in box[0]
    finally:
        release.set()
        first.join(30)


def test_a_stuck_read_costs_its_scrape_the_read_timeout_once_and_the_next_scrapes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_events(tmp_path, [json.dumps(e) for e in good_events()])
    release = threading.Event()
    calls: list[int] = []

    def stuck_open(base: Path, parts: Any, uid: int) -> int:
        calls.append(1)
        release.wait(120)
        raise OSError("gone")

    monkeypatch.setattr(ledgerread, "open_user_file", stuck_open)
    c = collector_for(monkeypatch, [record(tmp_path)], read_timeout_s=0.2)
    try:
        for _ in range(3):  # the first waits 0.2 s; the others find the read still stuck and do not start one
            returned, box = in_thread(lambda: scrape(c), timeout=60)
            assert returned and "hpr_cluster_productive_seconds_total" in box[0]
        assert calls == [1]
    finally:
        release.set()


def test_a_link_to_a_file_only_root_can_read_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "7.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in good_events()))
    os.chown(secret / "7.events.jsonl", NOBODY, NOBODY)  # even a file of the user's, reached through a link
    work = tmp_path / "work"
    (work / ".hpresilience").mkdir(parents=True)
    (work / ".hpresilience" / "jobs").symlink_to(secret)  # the directory is the link
    assert load_ledger(record(work), "", now=T0) is None
    work2 = tmp_path / "work2"
    job_dir(work2)
    (work2 / ".hpresilience" / "jobs" / "7.events.jsonl").symlink_to(secret / "7.events.jsonl")
    assert load_ledger(record(work2), "", now=T0) is None


def test_a_file_of_another_uid_is_not_the_jobs_ledger(tmp_path: Path) -> None:
    p = write_events(tmp_path, [json.dumps(e) for e in good_events()])
    led = load_ledger(record(tmp_path), "", now=T0)
    assert led is not None and led.attempts == 2  # the user's own file is read
    os.chown(p, 0, 0)  # root's (or any other user's) file under the user's directory
    assert load_ledger(record(tmp_path), "", now=T0) is None
    os.chown(p, NOBODY, NOBODY)
    assert load_ledger(record(tmp_path, user="no-such-user-hpr"), "", now=T0) is None


@pytest.mark.parametrize("bad", ["1e999", "-1e999", "NaN", "Infinity", "1" + "0" * 400])
def test_numbers_no_float_holds_neither_crash_nor_reach_the_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    lines = [json.dumps(e) for e in good_events()]
    for key in ("attempt", "time", "first_step", "step_s", "decided_at", "lost_s"):
        lines.insert(1, f'{{"event": "attempt_started", "time": {T0 + 1}, "{key}": {bad}, "nodes": "n9"}}')
        lines.insert(2, f'{{"event": "attempt_ended", "time": {T0 + 2}, "attempt": 1, "{key}": {bad}}}')
    write_events(tmp_path, lines)
    good = tmp_path / "good"
    write_events(good, [json.dumps(e) for e in good_events()], job_id=8)
    c = collector_for(monkeypatch, [record(tmp_path), record(good, 8)])
    body = scrape(c)  # a record no float holds took the whole /metrics down (ControllerAbsent fired)
    assert 'hpr_job_goodput_ratio{job_id="8"' in body
    for line in body.splitlines():
        if line.startswith("hpr_"):
            assert not line.rsplit(" ", 1)[1].lower().endswith(("inf", "nan")), line


def test_escape_sequences_in_a_cause_reach_no_terminal(tmp_path: Path) -> None:
    write_events(tmp_path, [json.dumps(e) for e in good_events(cause=f"hardware{ESC}\nfake line")])
    led = load_ledger(record(tmp_path), "", now=T0)
    assert led is not None
    text = render(led)
    total = ClusterGoodput()
    total.add(record(tmp_path), led)
    for out in (text, render_cluster(total)):
        assert "\x1b" not in out and "\x07" not in out and "\\x1b" in out
        assert not any(line.startswith("fake line") for line in out.splitlines())


def test_every_command_report_shows_control_characters_as_escapes(tmp_path: Path) -> None:
    """`hpresilience events` quotes node reasons (a user's text when a job's or a user's name is in them)."""
    EventLog(tmp_path).record("marked", "n1", "agent", why=f"reason {ESC}\rfaked")
    res = CliRunner().invoke(cli, ["events", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\r" not in res.output and "\\x1b]2;owned" in res.output


def test_restart_pairing_is_linear_in_the_attempts() -> None:
    """The work (lines the ledger runs, counted: no clock) for 8 times the attempts is about 8 times, not 64:
    pairing each restart with the attempt after it used to search the attempts again for each."""

    def events(n: int) -> list[dict[str, Any]]:
        out = []
        for i in range(1, n + 1):
            t = i * 10.0
            out.append(ev(t, "attempt_started", attempt=i, nodes="n1"))
            # progress seen, but no step counter until the last attempt: the search for the resuming one
            # scanned every later attempt
            step = {"first_step": 1} if i == n else {}
            out.append(ev(t + 5, "attempt_ended", attempt=i, first_progress_at=T0 + t + 2, step_s=1.0, **step))
            out.append(ev(t + 6, "fault_seen", cause="hardware", nodes="n1"))
        return out

    def work(n: int) -> int:
        evs = events(n)
        count = 0
        target = compute.__code__.co_filename

        def tracer(frame: FrameType, what: str, arg: Any) -> Any:
            nonlocal count
            if frame.f_code.co_filename != target:
                return None
            count += what == "line"
            return tracer

        sys.settrace(tracer)
        try:
            led = compute(7, evs)
        finally:
            sys.settrace(None)
        assert len(led.restarts) == n
        return count

    small, big = work(200), work(1600)
    assert big < 12 * small, (small, big)


def test_reading_stops_at_the_record_limit_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledgerread, "MAX_RECORDS", 50)
    lines = [json.dumps(ev(i, "attempt_started", attempt=i + 1, nodes="n1")) for i in range(500)]
    lines[10] = "x" * (ledgerread.MAX_LINE_BYTES + 10)  # an overlong line is skipped, not kept
    write_events(tmp_path, lines)
    led = load_ledger(record(tmp_path), "", now=T0)
    assert led is not None and led.attempts == 50
    assert any("first 50 record(s)" in n for n in led.notes)
