"""hpresilience.torch.heartbeat: stacks on request, only into a directory that is ours and private."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHILD = r"""
import os, sys, time
from hpresilience.torch.heartbeat import Heartbeat
hb = Heartbeat(fd=1)
hb.beat(1)
sys.stdout.flush()
def waiting_in_a_collective():
    time.sleep(30)
waiting_in_a_collective()
"""


def start(tmp: Path, evidence: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "HPR_AUTORESUME_JOB": "5",
        "RANK": "2",
        "SLURMD_NODENAME": "n7",
        "HPR_EVIDENCE_DIR": str(evidence),
    }
    return subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True, cwd=tmp)


def test_the_announced_signal_writes_the_ranks_python_stacks_into_the_evidence_dir(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    evidence.mkdir(mode=0o700)
    p = start(tmp_path, evidence)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        sig = int(line.split("stack_signal=")[1].split()[0])
        assert "rank=2" in line and "node=n7" in line and sig == int(signal.SIGRTMIN) + 3
        stack = evidence / f"stacks-rank2-{p.pid}.txt"
        deadline = time.monotonic() + 20
        # Asked again until the rank is in its wait: each request appends one dump of every thread.
        while "waiting_in_a_collective" not in (stack.read_text() if stack.exists() else ""):
            assert time.monotonic() < deadline, "no stack written"
            os.kill(p.pid, sig)
            time.sleep(0.2)
        assert p.poll() is None  # the signal was handled, not fatal
        assert stack.stat().st_mode & 0o777 == 0o600
    finally:
        p.kill()
        p.wait()


def test_a_shared_evidence_dir_is_not_trusted_and_no_signal_is_announced(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    evidence.mkdir(mode=0o700)
    os.chmod(evidence, 0o777)
    p = start(tmp_path, evidence)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("[hpr-heartbeat]") and "stack_signal" not in line
        assert list(evidence.iterdir()) == []
    finally:
        p.kill()
        p.wait()


def test_a_checkpoint_save_beats_and_a_repeated_step_counts_once(tmp_path: Path, monkeypatch: Any) -> None:
    """TieredCheckpointer.save() beats for its step; the loop's own beat of the same step adds no second step."""
    import torch

    from hpresilience.torch import CheckpointConfig, TieredCheckpointer, heartbeat

    hb = heartbeat.Heartbeat(
        env={heartbeat.JOB_ENV: "5", "HPR_HEARTBEAT_EVERY_S": "3600"}, fd=os.open(os.devnull, os.O_WRONLY)
    )
    hb._installed = True  # no stack signal in the test process
    monkeypatch.setattr(heartbeat, "_default", hb)
    with TieredCheckpointer(CheckpointConfig(namespace="hb", memory_dir=str(tmp_path), replicate=False)) as ck:
        ck.save({"w": torch.zeros(4)}, 3)
        assert hb._last_step == 3  # the save beat
        hb.beat(3)
        assert hb._steps == 0  # the loop's beat of the same step is no second step
    hb.beat(4)
    assert hb._steps == 1 and hb._last_step == 4


def test_the_blocking_part_of_save_and_load_is_reported_in_the_heartbeat_for_the_ledger(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """TieredCheckpointer's save, async_save, wait, load and close report the time they blocked training
    (`ckpt_s`, `restore_s`, the process's totals), and the wrapper's parser reads them (the ledger's input)."""
    import torch

    from hpresilience.autoresume.progress import parse_heartbeat
    from hpresilience.torch import CheckpointConfig, TieredCheckpointer, heartbeat

    r, w = os.pipe()
    hb = heartbeat.Heartbeat(env={heartbeat.JOB_ENV: "5", "HPR_HEARTBEAT_EVERY_S": "0"}, fd=w)
    hb._installed = True  # no stack signal in the test process
    monkeypatch.setattr(heartbeat, "_default", hb)
    with TieredCheckpointer(CheckpointConfig(namespace="hb", memory_dir=str(tmp_path), replicate=False)) as ck:
        # 4 MB each: async_save's blocking part (the copy it stages) stays above the beats' 1 ms resolution (with
        # 4 KB it took less once under load, and the two totals read the same).
        ck.save({"w": torch.zeros(1_000_000)}, 3)
        ck.async_save({"w": torch.ones(1_000_000)}, 4).result()
        ck.wait()
        assert ck.load({"w": torch.zeros(1_000_000)}) == 4
    os.close(w)
    with os.fdopen(r) as f:
        beats = [b for line in f.read().splitlines() if (b := parse_heartbeat(line)) is not None]
    totals = sorted({b.ckpt_s for b in beats if b.ckpt_s is not None and b.restore_s == 0})
    # The save's, then the save's and async_save's (wait() adds its own, often below the lines' 1 ms).
    assert len(totals) in (2, 3) and 0 < totals[0] < totals[1]
    last = beats[-1]
    # close() at the end of the with block: its flush is checkpoint time too (issue 32).
    assert last.restore_s is not None and last.restore_s > 0 and last.ckpt_s is not None
    assert last.ckpt_s >= totals[-1]
    assert last.step == 4  # the blocked-time line names the last step beaten, and is no progress of its own


FR_CHILD = r"""
import sys, time
import torch, torch.distributed as dist
from hpresilience.torch.heartbeat import Heartbeat
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
t = torch.ones(2)
for _ in range(3):
    dist.all_reduce(t)
hb = Heartbeat(fd=1)
hb.beat(1)
sys.stdout.flush()
time.sleep(30)
"""


def test_a_hang_request_makes_each_rank_dump_its_flight_recorder_into_the_evidence_dir(tmp_path: Path) -> None:
    """gloo records collectives but never dumps them: the heartbeat's thread writes the records (torch's own
    pickle) once the wrapper's `fr-request` appears, into a new private file the wrapper reads safely."""
    from hpresilience.autoresume.watch.flightrec import read_dumps, wavefront
    from tests.conftest import TEST_BASE_PORT

    evidence = tmp_path / "ev"
    evidence.mkdir(mode=0o700)
    env = {
        **os.environ,
        "HPR_AUTORESUME_JOB": "5",
        "RANK": "0",
        "SLURMD_NODENAME": "n1",
        "HPR_EVIDENCE_DIR": str(evidence),
        "TORCH_FR_BUFFER_SIZE": "100",
    }
    p = subprocess.Popen(
        [sys.executable, "-c", FR_CHILD, str(TEST_BASE_PORT + 871)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().startswith("[hpr-heartbeat]")
        assert not list(evidence.glob("fr-rank*"))  # nothing without a request
        (evidence / "fr-request").write_text("now\n")
        dump = evidence / f"fr-rank0-{p.pid}.pkl"
        deadline = time.monotonic() + 20
        while not dump.exists() or not dump.stat().st_size:
            assert time.monotonic() < deadline, "no flight-recorder dump"
            time.sleep(0.2)
        time.sleep(0.2)
        assert dump.stat().st_mode & 0o777 == 0o600
        front = wavefront(read_dumps(evidence), world=[0])
        assert front.dumps == 1 and front.groups["0"] == 3 and front.behind == []
    finally:
        p.kill()
        p.wait()


def test_stacks_go_into_the_evidence_dir_that_was_checked_even_if_its_path_is_swapped_for_a_link(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Whoever may rename the evidence dir's path swaps it for a link to a folder of theirs right after the
    check: the stack file is still made in the directory that was checked, not where the link leads."""
    import faulthandler

    from hpresilience.torch.heartbeat import Heartbeat

    evidence, theirs = tmp_path / "ev", tmp_path / "theirs"
    evidence.mkdir(mode=0o700)
    theirs.mkdir()
    os.chmod(theirs, 0o777)
    real_lstat, real_open = os.lstat, os.open
    swapped: list[bool] = []
    out = os.open(os.devnull, os.O_WRONLY)

    def swap_after(real: Any) -> Any:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            out = real(path, *args, **kwargs)
            if path == str(evidence) and not swapped:
                swapped.append(True)
                os.rename(evidence, tmp_path / "checked")
                os.symlink(theirs, evidence)
            return out

        return call

    monkeypatch.setattr(os, "lstat", swap_after(real_lstat))
    monkeypatch.setattr(os, "open", swap_after(real_open))
    hb = Heartbeat(env={"HPR_AUTORESUME_JOB": "5", "HPR_EVIDENCE_DIR": str(evidence)}, fd=out)
    hb.beat(1)
    monkeypatch.undo()
    try:
        assert swapped and hb._stack_signal
        assert list(theirs.iterdir()) == []
        assert [p.name for p in (tmp_path / "checked").iterdir()] == [f"stacks-rank0-{os.getpid()}.txt"]
    finally:
        if hb._stack_signal:
            faulthandler.unregister(hb._stack_signal)
        if hb._stack_file is not None:
            hb._stack_file.close()
        os.close(hb.fd)
