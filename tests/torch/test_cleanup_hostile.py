"""The epilog (root) against a hostile job user, and the tier root against a squatter (issue 31, points 2
and 7). Tests run as root: they hand folders to other uids with chown, as the users would have made them.

The swap race of point 2 is made deterministic: the swap happens inside the epilog's own read of `.job`,
after every check the epilog makes on the path and before it removes anything, which is the moment a
second job of the same user hits by looping `mv tier away; ln -s /shared tier`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpresilience.cli import main
from hpresilience.torch import CheckpointConfig, TieredCheckpointer
from hpresilience.torch.cleanup import open_root_only, remove_job_tiers
from hpresilience.torch.private import TierSecurityError
from tests.torch._workers import empty_state, matches, state_for

pytestmark = [
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
    pytest.mark.skipif(os.geteuid() != 0, reason="handing folders to other uids needs root (chown)"),
]

USER = 4321  # the job's user (no passwd entry needed: only numbers reach the kernel)
OTHER = 65534  # nobody: a third user, or the squatter


def _owned(p: Path, uid: int, mode: int) -> Path:
    os.chown(p, uid, uid, follow_symlinks=False)
    os.chmod(p, mode)
    return p


def _tier(root: Path, ns: str, job: str) -> Path:
    """What a job of USER leaves after a crash: a private root, a namespace, its .job and a shard."""
    root.mkdir(exist_ok=True)
    _owned(root, USER, 0o700)
    d = _owned(_mkdir(root / ns), USER, 0o700)
    _owned(_mkdir(d / "step_0000000001"), USER, 0o700)
    (d / "step_0000000001" / "rank_0.bin").write_bytes(b"x" * 4096)
    (d / ".job").write_text(job)
    _owned(d / ".job", USER, 0o600)
    return d


def _mkdir(p: Path) -> Path:
    p.mkdir()
    return p


def _epilog(capsys: pytest.CaptureFixture[str], pattern: str, job: str, uid: int, *extra: str) -> dict[str, Any]:
    argv = ["--json", "epilog", "--memory-root", pattern, "--job-id", job, "--uid", str(uid), *extra]
    assert main(argv) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_a_tier_root_swapped_for_a_link_after_the_checks_makes_root_delete_nothing_outside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another user's private files in a sticky shared folder, under the name of the user's namespace.
    shared = _owned(_mkdir(tmp_path / "shared"), 0, 0o1777)
    victim = _owned(_mkdir(shared / "drop"), OTHER, 0o700)
    secret = victim / "thesis.tex"
    secret.write_text("three years of work")
    _owned(secret, OTHER, 0o600)
    root = tmp_path / f"shm-{USER}"
    ns = _tier(root, "drop", "77")

    real_read = os.read
    swapped: list[bool] = []

    def read_then_swap(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        if not swapped and os.readlink(f"/proc/self/fd/{fd}").endswith("/.job"):
            swapped.append(True)  # the user's second job: the tier root becomes a link to the shared folder
            os.rename(root, tmp_path / "away")
            os.symlink(shared, root)
        return data

    monkeypatch.setattr(os, "read", read_then_swap)
    removed = remove_job_tiers("77", USER, str(tmp_path / "shm-{uid}"))
    monkeypatch.undo()
    assert swapped
    assert secret.read_text() == "three years of work" and victim.is_dir()
    # What was removed is the user's own namespace, where it went (root removed what it had checked).
    assert [r.folder for r in removed] == [str(ns)]
    assert not (tmp_path / "away" / "drop").exists()


def test_a_tier_root_that_is_a_link_is_not_followed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    ns = _tier(elsewhere, "ns", "5")
    os.symlink(elsewhere, tmp_path / f"shm-{USER}")
    assert _epilog(capsys, str(tmp_path / "shm-{uid}"), "5", USER)["removed"] == []
    assert (ns / ".job").exists()


def test_a_fifo_for_the_job_file_does_not_hang_the_epilog(tmp_path: Path) -> None:
    ns = _tier(tmp_path / f"shm-{USER}", "ns", "5")
    (ns / ".job").unlink()
    os.mkfifo(ns / ".job")  # opened for reading without O_NONBLOCK, this waits forever for a writer
    os.chown(ns / ".job", USER, USER)
    argv = [sys.executable, "-m", "hpresilience", "--json", "epilog", "--memory-root", str(tmp_path / "shm-{uid}")]
    try:
        done = subprocess.run([*argv, "--job-id", "5", "--uid", str(USER)], capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the epilog hung on a FIFO named .job (Slurm would drain the node)")
    assert done.returncode == 0 and json.loads(done.stdout)["removed"] == []


def test_root_does_not_empty_another_users_folder_found_inside_the_tier(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ns = _tier(tmp_path / f"shm-{USER}", "ns", "5")
    theirs = _owned(_mkdir(ns / "step_0000000001" / "theirs"), OTHER, 0o700)
    (theirs / "private").write_text("not the job user's to remove")
    assert _epilog(capsys, str(tmp_path / "shm-{uid}"), "5", USER)["removed"] == []
    assert (theirs / "private").exists()
    assert not (ns / "step_0000000001" / "rank_0.bin").exists()  # the user's own files are removed


def test_a_squatted_tier_root_fails_the_save_saying_what_to_do_and_the_epilog_frees_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The victim is this process's uid (root): the library's real save path, as that user."""
    me = os.geteuid()
    squat = _owned(_mkdir(tmp_path / f"shm-{me}"), OTHER, 0o755)  # `mkdir /dev/shm/hpresilience-<uid>`
    (squat / "junk").write_bytes(b"y" * 8192)
    _owned(_mkdir(squat / "more"), OTHER, 0o700)
    cfg = CheckpointConfig(namespace="run", memory_dir=str(tmp_path / "shm-{uid}"), replicate=False)
    with pytest.raises(TierSecurityError) as err:
        TieredCheckpointer(cfg)
    text = str(err.value)
    for said in (str(squat), f"made by uid {OTHER}", "epilog", "administrator", "memory_dir"):
        assert said in text
    out = _epilog(capsys, str(tmp_path / "shm-{uid}"), "9", me)
    assert out["removed"] == [{"folder": str(squat), "bytes": out["removed"][0]["bytes"], "squatter_uid": OTHER}]
    with TieredCheckpointer(cfg) as ck:
        ck.save(state_for(3, 0), 3)
        ck.flush()
        got = empty_state(0)
        assert ck.load(got) == 3 and matches(got, 3, 0)


def test_the_epilog_gives_the_freed_tier_root_to_the_jobs_user_so_it_cannot_be_squatted_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    squat = _owned(_mkdir(tmp_path / f"hpresilience-{USER}"), OTHER, 0o777)
    planted = _owned(_mkdir(squat / "ns"), OTHER, 0o777)
    os.symlink(tmp_path, planted / "link")  # never followed
    (tmp_path / "keep").write_text("k")
    _epilog(capsys, str(tmp_path / "hpresilience-{uid}"), "9", USER, "--gid", "4322")
    st = os.lstat(squat)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (USER, 4322, 0o700)
    assert os.listdir(squat) == [] and (tmp_path / "keep").exists()


def test_a_tier_root_of_another_owner_stays_where_a_user_controls_the_path_to_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The user owns the parent: through it (a link to another user's area, a folder renamed in) the name may
    # lead to a real root of someone else, so the epilog cannot take an owner mismatch for a squat there.
    area = _owned(_mkdir(tmp_path / "area"), USER, 0o755)
    theirs = _owned(_mkdir(area / f"hpresilience-{USER}"), OTHER, 0o700)
    (theirs / "data").write_text("d")
    assert _epilog(capsys, str(area / "hpresilience-{uid}"), "9", USER)["removed"] == []
    assert (theirs / "data").exists()
    # Nor does it remove a root that root made (an administrator's choice, not a squat).
    by_root = _owned(_mkdir(tmp_path / f"t-{USER}"), 0, 0o755)
    assert _epilog(capsys, str(tmp_path / "t-{uid}"), "9", USER)["removed"] == []
    assert by_root.exists()


def test_only_paths_no_user_can_redirect_count_as_roots_own(tmp_path: Path) -> None:
    d = _mkdir(tmp_path / "d")
    assert _closes(open_root_only(str(d)))
    os.symlink(d, tmp_path / "by-root")
    assert _closes(open_root_only(str(tmp_path / "by-root")))  # root's own link is followed
    os.symlink(d, tmp_path / "by-user")
    os.chown(tmp_path / "by-user", USER, USER, follow_symlinks=False)
    assert not _closes(open_root_only(str(tmp_path / "by-user")))
    _owned(d, USER, 0o755)
    assert not _closes(open_root_only(str(d)))
    _owned(d, 0, 0o777)  # writable by all and not sticky: anyone may replace its entries
    assert not _closes(open_root_only(str(d)))
    _owned(d, 0, 0o1777)
    assert _closes(open_root_only(str(d)))


def _closes(fd: int | None) -> bool:
    if fd is None:
        return False
    os.close(fd)
    return True


def test_a_relative_root_pattern_is_taken_from_the_working_directory_not_from_slash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = _tier(tmp_path / f"shm-{USER}", "ns", "5")
    monkeypatch.chdir(tmp_path)
    assert [r.folder for r in remove_job_tiers("5", USER, "shm-{uid}")] == [str(ns)]
