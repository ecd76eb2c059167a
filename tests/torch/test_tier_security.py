"""The memory tier cannot be hijacked by another user (issue 14, item 11): regression tests of the attack.

The attack: another user pre-creates the predictable namespace folder world-writable and plants a
`.metadata` whose unpickling runs code. Tests that hand files to another uid need root (chown).
"""

from __future__ import annotations

import os
import pickle
import pwd
from pathlib import Path
from typing import Any

import pytest

from hpresilience.torch import CheckpointConfig, MemoryTier, TieredCheckpointer, TierStorageReader
from hpresilience.torch.layout import COMMIT, METADATA, step_name
from hpresilience.torch.private import TierSecurityError
from tests.torch._workers import empty_state, matches, state_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another uid needs root (chown)")


class _Payload:
    """Unpickling this creates the file named in `marker`: the code an attacker would run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _nobody() -> tuple[int, int]:
    pw = pwd.getpwnam("nobody")
    return pw.pw_uid, pw.pw_gid


def _plant(ns_dir: Path, marker: Path, owner: tuple[int, int] | None) -> None:
    """What the attacker leaves: a committed-looking step whose metadata runs code when unpickled."""
    d = ns_dir / step_name(1)
    d.mkdir(parents=True)
    (d / METADATA).write_bytes(pickle.dumps(_Payload(str(marker))))
    (d / COMMIT).write_text('{"step": 1, "world_size": 1, "save_id": "x", "time": 0}')
    (d / "rank_0.bin").write_bytes(b"")
    (d / "rank_0.idx").write_text('{"rank": 0, "step": 1, "size": 0, "items": []}')
    for p in (ns_dir, d, *d.iterdir()):
        if owner is not None:
            os.chown(p, *owner)
        os.chmod(p, 0o777 if p.is_dir() else 0o666)


@needs_root
def test_root_precreated_by_another_user_is_refused_and_planted_metadata_never_runs(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    marker = tmp_path / "PWNED"
    _plant(root / "job1", marker, _nobody())
    os.chown(root, *_nobody())
    os.chmod(root, 0o777)
    with pytest.raises(TierSecurityError, match="made by uid"):
        TieredCheckpointer(CheckpointConfig(namespace="job1", memory_dir=str(root)))
    assert not marker.exists()


@needs_root
def test_world_writable_namespace_of_another_user_in_our_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    marker = tmp_path / "PWNED"
    _plant(root / "job1", marker, _nobody())
    with pytest.raises(TierSecurityError, match="job1 belongs to uid"):
        TieredCheckpointer(CheckpointConfig(namespace="job1", memory_dir=str(root)))
    assert not marker.exists()


def test_group_or_world_writable_root_of_our_own_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(TierSecurityError, match="writable by group or others"):
        TieredCheckpointer(CheckpointConfig(namespace="job1", memory_dir=str(root)))


def test_metadata_file_another_user_could_change_is_never_unpickled(tmp_path: Path) -> None:
    """Even inside the user's own tier, a .metadata open to others is refused before pickle sees it."""
    tier = MemoryTier(tmp_path / "shm", "job1")
    tier.ensure()
    marker = tmp_path / "PWNED"
    _plant(tier.base / "inner", marker, None)  # our uid but mode 0666: anyone could have rewritten it
    step_dir = tier.base / "inner" / step_name(1)
    with pytest.raises(Exception, match="writable by group or others"):
        TierStorageReader(step_dir).read_metadata()
    assert not marker.exists()


@needs_root
def test_metadata_owned_by_another_user_is_never_unpickled_by_load(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    marker = tmp_path / "PWNED"
    with TieredCheckpointer(CheckpointConfig(namespace="job1", memory_dir=str(root))) as ck:
        _plant(ck.tier.base / "x", marker, _nobody())
        d = ck.tier.step_dir(1)
        os.rename(ck.tier.base / "x" / step_name(1), d)
        for p in d.iterdir():
            os.chmod(p, 0o644)  # not writable by others, but owned by nobody: still not ours
        assert ck.load(empty_state(0)) is None
    assert not marker.exists()


def test_tier_files_are_private_and_links_are_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    with TieredCheckpointer(CheckpointConfig(namespace="job1", memory_dir=str(root))) as ck:
        d = ck.tier.step_dir(1)
        d.mkdir()
        # A link where the shard's temporary file will go must not redirect the write.
        (d / "rank_0.bin.tmp").symlink_to(victim)
        ck.save({"x": __import__("torch").ones(4)}, 1)
        ck.flush()
        assert victim.read_text() == "keep me"
        assert oct(os.stat(root).st_mode & 0o777) == "0o700"
        assert oct(os.stat(ck.tier.base).st_mode & 0o777) == "0o700"
        assert oct(os.stat(d / "rank_0.bin").st_mode & 0o777) == "0o600"


def test_default_memory_root_is_per_user(tmp_path: Path) -> None:
    cfg = CheckpointConfig(namespace="job1")
    tier = MemoryTier(cfg.memory_dir, cfg.namespace)
    assert tier.root == Path(f"/dev/shm/hpresilience-{os.geteuid()}")


def test_restore_from_s3_works_under_a_group_writable_umask(tmp_path: Path, s3_endpoint: str) -> None:
    """Shared clusters often run with umask 002; files the tier writes or downloads stay private anyway."""
    old = os.umask(0o002)
    try:
        cfg: dict[str, Any] = {"s3_base": "s3://ckpt/umask", "s3_every": 1, "s3_endpoint_url": s3_endpoint}
        with TieredCheckpointer(CheckpointConfig(namespace="u", memory_dir=str(tmp_path / "a"), **cfg)) as ck:
            ck.save(state_for(1, 0), 1)
            ck.flush()
        with TieredCheckpointer(CheckpointConfig(namespace="u", memory_dir=str(tmp_path / "b"), **cfg)) as ck2:
            got = empty_state(0)
            assert ck2.load(got) == 1 and ck2.last_source == "s3" and matches(got, 1, 0)
    finally:
        os.umask(old)
