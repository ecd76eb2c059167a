"""check_alive(): signals, the agent's notice file and the EC2 spot notice turn it False."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import ValidationError

from hpresilience.torch import preemption
from hpresilience.torch.preemption import PreemptionWatcher, spot_interruption
from hpresilience.torch.settings import PreemptionConfig


@pytest.fixture()
def watcher_factory() -> Iterator[list[PreemptionWatcher]]:
    made: list[PreemptionWatcher] = []
    yield made
    for w in made:
        w.stop()


def _start(made: list[PreemptionWatcher], **kw: object) -> PreemptionWatcher:
    w = PreemptionWatcher(PreemptionConfig(**kw)).start()  # type: ignore[arg-type]
    made.append(w)
    return w


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_slurm_signal_marks_job_as_going_away(watcher_factory: list[PreemptionWatcher], sig: int) -> None:
    w = _start(watcher_factory)
    assert w.alive()
    os.kill(os.getpid(), sig)
    assert not w.alive()
    assert w.reason == f"signal {signal.Signals(sig).name}"


def test_configured_signal_list_is_honoured(watcher_factory: list[PreemptionWatcher]) -> None:
    w = _start(watcher_factory, signals=("USR2",))
    assert signal.getsignal(signal.SIGUSR1) is not w._on_signal
    os.kill(os.getpid(), signal.SIGUSR2)
    assert not w.alive()


def test_handlers_are_restored_on_stop(watcher_factory: list[PreemptionWatcher]) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    w = PreemptionWatcher().start()
    w.stop()
    assert signal.getsignal(signal.SIGUSR1) == before


def test_notice_file_written_by_agent(watcher_factory: list[PreemptionWatcher], tmp_path: Path) -> None:
    notice = tmp_path / "node-going-away"
    w = _start(watcher_factory, notice_file=str(notice), signals=())
    assert w.alive()
    notice.write_text("Action:Replace")
    assert not w.alive()
    assert "notice file" in (w.reason or "")


def test_the_wrapper_notice_file_turns_check_alive_false_and_a_link_there_does_not(
    watcher_factory: list[PreemptionWatcher], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """srun --auto-resume exports HPR_NOTICE_FILE; the file appearing is its notice of a planned move. A symbolic
    link planted at that name (another user's trick) is not a notice."""
    private = tmp_path / "hpr-notice"
    private.mkdir(mode=0o700)
    notice = private / "notice"
    monkeypatch.setenv("HPR_NOTICE_FILE", str(notice))
    w = _start(watcher_factory, signals=())
    assert w.alive()
    notice.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("x")
    assert w.alive()
    notice.unlink()
    notice.write_text("grow back to 3 nodes")
    assert not w.alive()
    assert "auto-resume wrapper moves the step" in (w.reason or "")


def test_unknown_signal_name_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="unknown signal"):
        PreemptionConfig(signals=("SIGNOPE",))


class _Imds(BaseHTTPRequestHandler):
    action: dict[str, str] | None = None
    token_seen: ClassVar[list[str]] = []

    def do_PUT(self) -> None:
        body = b"tok-123"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.token_seen.append(self.headers.get("X-aws-ec2-metadata-token", ""))
        if self.path != "/latest/meta-data/spot/instance-action" or self.action is None:
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps(self.action).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def imds() -> Iterator[str]:
    _Imds.action = None
    _Imds.token_seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_spot_notice_absent_is_404_and_present_is_the_action(imds: str) -> None:
    assert spot_interruption(imds) is None
    _Imds.action = {"action": "terminate", "time": "2026-11-23T08:22:00Z"}
    assert spot_interruption(imds) == "terminate at 2026-11-23T08:22:00Z"
    assert _Imds.token_seen == ["tok-123", "tok-123"]  # IMDSv2: the session token rides on every GET


def test_spot_notice_polled_in_background_only_when_enabled(
    watcher_factory: list[PreemptionWatcher], imds: str
) -> None:
    off = _start(watcher_factory, signals=(), ec2_metadata_url=imds, ec2_poll_s=0.05)
    on = _start(watcher_factory, signals=(), ec2_spot=True, ec2_metadata_url=imds, ec2_poll_s=0.05)
    _Imds.action = {"action": "stop", "time": "2026-11-23T08:22:00Z"}
    deadline = time.monotonic() + 5
    while on.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not on.alive() and "spot" in (on.reason or "")
    assert off.alive() and off._thread is None


def test_check_alive_uses_the_installed_watcher(tmp_path: Path) -> None:
    notice = tmp_path / "n"
    w = preemption.install(PreemptionConfig(notice_file=str(notice), signals=()))
    try:
        assert preemption.check_alive()
        notice.touch()
        assert not preemption.check_alive()
    finally:
        w.stop()
        preemption._default = None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another user")
def test_notice_file_is_trusted_only_when_root_owns_it_and_its_directory(
    watcher_factory: list[PreemptionWatcher], tmp_path: Path
) -> None:
    """On a shared node a user must not be able to stop another user's ranks by creating the notice file."""
    d = tmp_path / "run"
    d.mkdir(mode=0o755)
    notice = d / "notice.json"
    w = _start(watcher_factory, notice_file=str(notice), signals=())
    notice.write_text("{}")
    os.chown(notice, 65534, 65534)  # a user's file
    assert w.alive() and "uid 65534" in (preemption.untrusted_notice(str(notice)) or "")
    os.chown(notice, 0, 0)
    os.chmod(notice, 0o666)  # root's, but anyone may rewrite it
    assert w.alive()
    os.chmod(notice, 0o644)
    os.chmod(d, 0o1777)  # a directory others write (like /tmp): they could have put it there
    assert w.alive() and "directory" in (preemption.untrusted_notice(str(notice)) or "")
    os.chmod(d, 0o755)
    link = tmp_path / "link.json"
    link.symlink_to(notice)
    assert preemption.untrusted_notice(str(link)) == "not a regular file"
    assert not w.alive() and "notice file" in (w.reason or "")


def test_the_agents_notice_file_is_watched_by_default() -> None:
    from hpresilience.reasons import NODE_NOTICE_FILE

    assert PreemptionConfig().notice_file == NODE_NOTICE_FILE == "/run/hpresilience/notice.json"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_a_wrapper_notice_in_a_directory_another_user_made_is_not_a_notice(
    watcher_factory: list[PreemptionWatcher], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wrapper makes the notice's directory 0700 only when it writes the notice: a directory another user
    made at that name first (open to all) holds nothing that is the wrapper's word, even a file of ours."""
    squat = tmp_path / "hpr-notice"
    squat.mkdir()
    os.chown(squat, 65534, 65534)
    os.chmod(squat, 0o777)
    (squat / "notice").write_text("x")  # ours (root's), e.g. hard-linked there where the kernel allows it
    monkeypatch.setenv("HPR_NOTICE_FILE", str(squat / "notice"))
    assert _start(watcher_factory, signals=()).alive()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make root-owned folders for a user's path")
def test_the_agents_notice_is_judged_in_one_resolution_so_a_swapped_path_cannot_fake_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user owning a folder above the notice's directory shows root's file elsewhere to the file check (a
    link) and a real root directory to the directory check (renamed in between): not a notice."""
    g = tmp_path / "g"  # the user's folder on the path
    g.mkdir()
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir(mode=0o755)
    (elsewhere / "notice.json").write_text("{}")  # any root file of that name
    os.chmod(elsewhere / "notice.json", 0o644)
    (g / "real").mkdir(mode=0o755)  # root's directory for the notice, empty: no notice
    (g / "run").symlink_to(elsewhere)
    path = str(g / "run" / "notice.json")
    real_lstat = os.lstat
    swapped: list[bool] = []

    def lstat_then_swap(p: str, *args: object, **kwargs: object) -> os.stat_result:
        out = real_lstat(p, *args, **kwargs)  # type: ignore[arg-type]
        if p == path and not swapped:
            swapped.append(True)
            os.unlink(g / "run")
            os.rename(g / "real", g / "run")
        return out

    monkeypatch.setattr(os, "lstat", lstat_then_swap)
    why = preemption.untrusted_notice(path)
    monkeypatch.undo()
    assert swapped and why is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another user")
@pytest.mark.parametrize(
    "planted",
    ["file_of_another_user", "directory_of_another_user", "directory_others_may_enter", "directory_is_a_link"],
)
def test_the_wrapper_notice_is_trusted_only_as_this_users_file_in_this_users_0700_directory(
    watcher_factory: list[PreemptionWatcher], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str
) -> None:
    """Issue 32: each check of the wrapper's notice (own uid, own 0700 directory, no link) has a test that fails
    without it. Another user on a shared node must not stop this user's ranks by preparing the notice path."""
    private = tmp_path / "hpr-0-abc" if planted != "directory_is_a_link" else tmp_path / "real"
    private.mkdir(mode=0o700)
    notice = private / "notice"
    notice.write_text("grow back to 3 nodes")
    path = notice
    if planted == "file_of_another_user":
        os.chown(notice, 65534, 65534)
    elif planted == "directory_of_another_user":
        os.chown(private, 65534, 65534)
    elif planted == "directory_others_may_enter":
        os.chmod(private, 0o755)
    else:
        link = tmp_path / "hpr-0-abc"
        link.symlink_to(private)
        path = link / "notice"
    monkeypatch.setenv("HPR_NOTICE_FILE", str(path))
    w = _start(watcher_factory, signals=())
    assert w.alive(), planted
    # The same file, this user's in this user's 0700 directory, is the notice.
    os.chown(notice, 0, 0)
    os.chown(private, 0, 0)
    os.chmod(private, 0o700)
    monkeypatch.setenv("HPR_NOTICE_FILE", str(notice))
    assert not _start(watcher_factory, signals=()).alive()
