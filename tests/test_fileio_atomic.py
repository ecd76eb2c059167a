"""fileio.atomic_write, the package's one atomic write: readers see the old file or the new one, never a
part; the temporary file lives beside the target and is gone after success and failure alike."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpresilience.fileio import atomic_write, atomic_write_text


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


def test_bytes_and_text_replace_the_whole_file(tmp_path: Path) -> None:
    p = tmp_path / "state.json"
    atomic_write(p, b"\x00binary\xff")
    assert p.read_bytes() == b"\x00binary\xff"
    atomic_write_text(p, "caf\u00e9\n")
    assert p.read_text(encoding="utf-8") == "caf\u00e9\n" and leftovers(tmp_path) == []


def test_default_mode_is_private_and_mode_is_set_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader must never see the file with the wrong permissions, even for an instant: the mode is on the
    temporary file when it is renamed."""
    p = tmp_path / "a"
    atomic_write(p, b"x")
    assert p.stat().st_mode & 0o777 == 0o600
    seen: list[int] = []
    real_replace = os.replace

    def spy(src: str, dst: Path) -> None:
        seen.append(os.stat(src).st_mode & 0o777)
        real_replace(src, dst)

    monkeypatch.setattr("hpresilience.fileio.os.replace", spy)
    atomic_write(tmp_path / "b.prom", b"x", mode=0o644)
    assert seen == [0o644] and (tmp_path / "b.prom").stat().st_mode & 0o777 == 0o644


def test_fsync_happens_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        order.append("fsync")
        real_fsync(fd)

    def replace(a: str, b: Path) -> None:
        order.append("replace")
        real_replace(a, b)

    monkeypatch.setattr("hpresilience.fileio.os.fsync", fsync)
    monkeypatch.setattr("hpresilience.fileio.os.replace", replace)
    atomic_write(tmp_path / "f", "data", fsync=True)
    assert order == ["fsync", "replace"]
    order.clear()
    atomic_write(tmp_path / "g", "data")
    assert order == ["replace"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "state"
    atomic_write(p, b"old")

    def full_disk(src: str, dst: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("hpresilience.fileio.os.replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        atomic_write(p, b"new")
    assert p.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_the_temporary_file_is_in_the_target_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same directory, so the rename never crosses file systems (a rename across them is a copy)."""
    dirs: list[str] = []
    real_replace = os.replace

    def replace(a: str, b: Path) -> None:
        dirs.append(os.path.dirname(a))
        real_replace(a, b)

    monkeypatch.setattr("hpresilience.fileio.os.replace", replace)
    atomic_write(tmp_path / "sub" / "f", b"x")
    assert dirs == [str(tmp_path / "sub")]


def test_make_parents_false_refuses_a_missing_directory(tmp_path: Path) -> None:
    """The checkpoint tiers make their folders private themselves; a write must not create one with the umask."""
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "missing" / "COMMIT", b"x", make_parents=False)
    assert not (tmp_path / "missing").exists()


def test_a_link_planted_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "COMMIT").symlink_to(victim)
    atomic_write(tmp_path / "COMMIT", b"marker")
    assert victim.read_text() == "keep" and not (tmp_path / "COMMIT").is_symlink()
