"""The process seam: a command's whole process group dies at its timeout (and, by default, when it exits),
output comes back from pipes or a file, and a command that cannot start is the package's own error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hpresilience import proc
from hpresilience.errors import EnvironmentMissing, ExternalError


def gone(pid: int, within: float = 5.0) -> bool:
    """True once `pid` no longer runs (a zombie counts as gone); SIGKILL may take a moment on a loaded box."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def wait_for_pid(pidfile: Path) -> int:
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "the command never wrote its pid"
        time.sleep(0.02)
    return int(pidfile.read_text().split()[0])


def test_timeout_kills_the_grandchild_too(tmp_path: Path) -> None:
    """The shell's background `sleep` holds the pipes open: killing only the shell would leave it running
    (and the call waiting on it). The whole group is killed, and the result says it timed out."""
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    res = proc.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout=1.5)
    assert res.timed_out and res.returncode is None and not res.ok
    assert time.monotonic() - started < 5 and res.duration_s >= 1.5
    assert gone(int(pidfile.read_text()))
    assert "timed out" in res.describe()


def test_leftovers_are_killed_when_the_command_exits(tmp_path: Path) -> None:
    """A command that exits at once but leaves a background process behind: that process dies with it."""
    res = proc.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], timeout=10)
    assert res.ok
    assert gone(int(res.stdout))


def test_kill_leftovers_false_leaves_a_daemon_alone() -> None:
    """A site tool may leave a daemon on purpose (ssh's ControlPersist master): the caller can allow it."""
    res = proc.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], timeout=10, kill_leftovers=False)
    pid = int(res.stdout)
    try:
        assert not gone(pid, within=0.3)
    finally:
        os.kill(pid, signal.SIGKILL)


def _kill_program_by_group(tmp_path: Path, setup: str) -> tuple[int, bool]:
    """A program that runs `sleep 300` through proc.run after `setup`, killed as slurmd kills an overrunning
    HealthCheckProgram: SIGKILL to its process group. The command has a session of its own, so that kill misses
    it. (the command's pid, whether it died with the program)."""
    pidfile = tmp_path / "pid"
    command = f"['sh', '-c', 'echo $$ > {pidfile}; exec sleep 300']"
    program = f"from hpresilience import proc; {setup}; proc.run({command}, timeout=300)"
    checker = subprocess.Popen([sys.executable, "-c", program], start_new_session=True)
    pid = 0
    try:
        pid = wait_for_pid(pidfile)
        assert not gone(pid, within=0.3)
        os.killpg(checker.pid, signal.SIGKILL)
        checker.wait(10)
        return pid, gone(pid)
    finally:
        checker.kill()
        if pid and not gone(pid, within=0):
            os.kill(pid, signal.SIGKILL)


def test_a_command_a_health_check_started_dies_with_the_program_killed_by_group(tmp_path: Path) -> None:
    """stress-ng in the field: started while the check's tracker is bound, it must not run on to its own timeout
    once slurmd has killed the HealthCheckProgram."""
    _, died = _kill_program_by_group(tmp_path, "proc.bind_tracker(proc.ProcessTracker())")
    assert died, "the check's command outlived the program that started it"


def test_a_command_started_outside_a_check_outlives_its_program(tmp_path: Path) -> None:
    """A controller's re-imaging script must finish what it started when the controller dies mid-call (the
    restarted controller waits for the node it brings back), and a Slurm command keeps Python's vfork."""
    _, died = _kill_program_by_group(tmp_path, "pass")
    assert not died


def test_pipes_carry_stdout_stderr_and_exit_code() -> None:
    res = proc.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (res.returncode, res.stdout, res.stderr, res.timed_out) == (3, "out\n", "err\n", False)
    assert res.argv == ("sh", "-c", "echo out; echo err >&2; exit 3")
    assert res.describe() == "`sh -c echo out; echo err >&2; exit 3` exited 3: err"


def test_output_to_a_file_holds_both_streams_and_the_result_its_tail(tmp_path: Path) -> None:
    """Output to a file (a re-imaging script must not die of SIGPIPE if the caller dies): both streams land
    there in order, and the result's stdout is the end of what the command wrote."""
    out = tmp_path / "out.log"
    res = proc.run(["sh", "-c", "echo one; echo two >&2; seq 1 5000"], timeout=10, output=out)
    text = out.read_text()
    assert text.startswith("one\ntwo\n1\n") and text.endswith("4999\n5000\n")
    assert res.ok and res.stderr == "" and res.stdout.endswith("5000\n")
    assert len(res.stdout) == proc.OUTPUT_TAIL


def test_output_to_an_open_file_returns_only_what_this_command_wrote(tmp_path: Path) -> None:
    with open(tmp_path / "log", "w+b") as f:
        f.write(b"earlier\n")
        res = proc.run(["echo", "now"], timeout=10, output=f)
    assert res.stdout == "now\n" and (tmp_path / "log").read_text() == "earlier\nnow\n"


def test_a_timed_out_command_writing_to_a_file_keeps_its_output(tmp_path: Path) -> None:
    res = proc.run(["sh", "-c", "echo started; sleep 60"], timeout=1.0, output=tmp_path / "o")
    assert res.timed_out and res.stdout == "started\n"


def test_env_extra_env_cwd_and_stdin(tmp_path: Path) -> None:
    res = proc.run(
        ["sh", "-c", 'echo "$A-$B"; pwd; cat'],
        timeout=10,
        env={"PATH": os.environ["PATH"], "A": "a"},
        extra_env={"B": "b"},
        cwd=tmp_path,
        input_text="piped\n",
    )
    assert res.stdout.splitlines() == ["a-b", str(tmp_path), "piped"]
    inherited = proc.run(["sh", "-c", "echo $HOME"], timeout=10, extra_env={"X": "1"})
    assert inherited.stdout.strip() == os.environ["HOME"]


def test_missing_command_is_environment_missing(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentMissing, match="not found"):
        proc.run([str(tmp_path / "no-such-tool")], timeout=5)


def test_a_file_that_cannot_be_executed_is_an_external_error(tmp_path: Path) -> None:
    p = tmp_path / "tool"
    p.write_text("#!/bin/sh\n")
    p.chmod(0o644)
    with pytest.raises(ExternalError, match="cannot run"):
        proc.run([str(p)], timeout=5)


def test_missing_cwd_names_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ExternalError, match="no directory"):
        proc.run(["true"], timeout=5, cwd=tmp_path / "gone")


def test_a_cancelled_tracker_starts_nothing_more() -> None:
    tracker = proc.ProcessTracker()
    tracker.kill_all()
    proc.bind_tracker(tracker)
    try:
        res = proc.run(["sh", "-c", "echo should-not-run"], timeout=5)
    finally:
        proc.bind_tracker(None)
    assert res.timed_out and res.stdout == "" and res.stderr == "cancelled"


def test_background_registers_with_the_tracker_and_its_group_dies_with_the_block(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    tracker = proc.ProcessTracker()
    proc.bind_tracker(tracker)
    try:
        with proc.background(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]) as server:
            child = wait_for_pid(pidfile)
            assert tracker.kill_all() == [server.pid]
            assert gone(child)
    finally:
        proc.bind_tracker(None)
    assert server.returncode is not None


def test_background_kills_its_group_when_the_block_ends(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with proc.background(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]):
        child = wait_for_pid(pidfile)
    assert gone(child)


def test_resolve_finds_tools_on_path_or_by_path(tmp_path: Path) -> None:
    assert proc.resolve("sh") is not None
    assert proc.resolve(str(tmp_path / "nothing")) is None
    assert proc.resolve("no-such-tool-hpr") is None


def test_describe_with_a_tail_keeps_the_lines_above_the_last() -> None:
    """mariadb-install-db and slurmctld print the cause a few lines above their last line."""
    res = proc.run(["sh", "-c", "echo 'cause: no space' >&2; echo 'giving up' >&2; exit 1"], 10)
    assert res.describe() == "`sh -c echo 'cause: no space' >&2; echo 'giving up' >&2; exit 1` exited 1: giving up"
    assert res.describe(tail=40).endswith("exited 1: cause: no space\ngiving up")
    assert proc.run(["true"], 10).describe(tail=40) == "`true` exited 0: no output"
