"""The durable tier, S3 (moto over real HTTP) or a shared filesystem (issue 22, items 4 and 5): the same
commit rule (marker last), retention, and verified loads that fall back to the newest step that verifies,
saying which step and why. Single process; the multi-rank paths are in test_multiprocess/test_elastic."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpresilience.errors import ConfigError
from hpresilience.torch import CheckpointConfig, TieredCheckpointer
from tests.torch._workers import empty_state, matches, run_ranks, state_for

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(params=["s3", "filesystem"])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    if request.param == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        yield {"s3_base": f"s3://ckpt/{tmp_path.name}", "s3_endpoint_url": endpoint}
    else:
        shared = tmp_path / "shared"
        shared.mkdir()
        yield {"fs_base": str(shared)}


def _ck(tmp_path: Path, durable: dict[str, Any], **kw: Any) -> TieredCheckpointer:
    cfg = CheckpointConfig(namespace="d", memory_dir=str(tmp_path / "mem"), replicate=False, **durable, **kw)
    return TieredCheckpointer(cfg)


def _saved(tmp_path: Path, durable: dict[str, Any], steps: list[int], **kw: Any) -> None:
    ck = _ck(tmp_path, durable, s3_every=1, **kw)
    for s in steps:
        ck.save(state_for(s, 0), s)
    assert ck.flush(timeout=60)
    assert ck.close(timeout=60)  # a clean end also removes the memory tier: only the durable tier is left
    assert not (tmp_path / "mem" / "d").exists()


def _read(ck: TieredCheckpointer, key: str) -> bytes:
    tier: Any = ck.durable
    if tier.kind == "s3":
        return bytes(tier.client.get_object(Bucket=tier.bucket, Key=f"{tier.base}/{key}")["Body"].read())
    return Path(tier.base, key).read_bytes()


def _write(ck: TieredCheckpointer, key: str, body: bytes | None) -> None:
    tier: Any = ck.durable
    if tier.kind == "s3":
        if body is None:
            tier.client.delete_object(Bucket=tier.bucket, Key=f"{tier.base}/{key}")
        else:
            tier.client.put_object(Bucket=tier.bucket, Key=f"{tier.base}/{key}", Body=body)
        return
    p = Path(tier.base, key)
    if body is None:
        p.unlink()
    else:
        p.write_bytes(body)


def _load(ck: TieredCheckpointer) -> tuple[int | None, bool]:
    got = empty_state(0)
    step = ck.load(got)
    return step, step is not None and matches(got, step, 0)


def test_committed_steps_restore_from_the_durable_tier_once_memory_is_gone(
    tmp_path: Path, durable: dict[str, Any]
) -> None:
    _saved(tmp_path, durable, [1, 2])
    with _ck(tmp_path, durable) as ck:
        assert ck.durable is not None and ck.durable.committed_steps() == [1, 2]
        assert _load(ck) == (2, True)
        assert ck.last_source == ck.durable.kind and ck.last_skipped == []


def test_a_flipped_byte_in_the_newest_durable_step_falls_back_to_the_previous_one_and_says_why(
    tmp_path: Path, durable: dict[str, Any]
) -> None:
    _saved(tmp_path, durable, [1, 2])
    with _ck(tmp_path, durable) as ck:
        raw = bytearray(_read(ck, "step_0000000002/rank_0.bin"))
        raw[len(raw) // 2] ^= 0x10
        _write(ck, "step_0000000002/rank_0.bin", bytes(raw))
        assert _load(ck) == (1, True)
        assert len(ck.last_skipped) == 1 and "step 2, rank 0" in ck.last_skipped[0]
        assert "checksum" in ck.last_skipped[0]


def test_a_missing_durable_shard_falls_back_to_the_previous_step(tmp_path: Path, durable: dict[str, Any]) -> None:
    _saved(tmp_path, durable, [1, 2])
    with _ck(tmp_path, durable) as ck:
        _write(ck, "step_0000000002/rank_0.bin", None)
        assert _load(ck) == (1, True)
        assert ck.last_skipped and "step 2" in ck.last_skipped[0]


def test_a_step_without_its_marker_is_never_loaded(tmp_path: Path, durable: dict[str, Any]) -> None:
    _saved(tmp_path, durable, [1, 2])
    with _ck(tmp_path, durable) as ck:
        _write(ck, "_committed/step_0000000002", None)
        assert ck.durable is not None and ck.durable.committed_steps() == [1]
        assert _load(ck) == (1, True)


def test_durable_retention_keeps_the_newest_steps_and_drops_markers_first(
    tmp_path: Path, durable: dict[str, Any]
) -> None:
    _saved(tmp_path, durable, [1, 2, 3], s3_keep=2)
    with _ck(tmp_path, durable) as ck:
        assert ck.durable is not None and ck.durable.committed_steps() == [2, 3]
        assert _load(ck) == (3, True)


def test_a_damaged_memory_shard_is_replaced_by_the_same_step_from_the_durable_tier(
    tmp_path: Path, durable: dict[str, Any]
) -> None:
    ck = _ck(tmp_path, durable, s3_every=1)
    ck.save(state_for(1, 0), 1)
    ck.save(state_for(2, 0), 2)
    assert ck.flush(timeout=60)
    shard = ck.tier.step_dir(2) / "rank_0.bin"
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0x01
    shard.write_bytes(bytes(raw))
    assert _load(ck) == (2, True)
    assert ck.durable is not None and ck.last_source == ck.durable.kind
    assert "own memory tier" in ck.last_skipped[0]
    ck.close()


def test_filesystem_tier_files_are_private_and_the_marker_comes_last(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    _saved(tmp_path, {"fs_base": str(shared)}, [1])
    base = shared / "d"
    files = [p for p in base.rglob("*") if p.is_file()]
    assert sorted(p.relative_to(base).as_posix() for p in files) == [
        "_committed/step_0000000001",
        "step_0000000001/.metadata",
        "step_0000000001/rank_0.bin",
        "step_0000000001/rank_0.idx",
    ]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    marker = base / "_committed/step_0000000001"
    assert all(os.stat(p).st_mtime_ns <= marker.stat().st_mtime_ns for p in files)


def test_one_durable_tier_and_an_absolute_fs_base_are_required() -> None:
    with pytest.raises(ValueError, match="both set"):
        CheckpointConfig(namespace="x", s3_base="s3://b/p", fs_base="/fsx/ckpt")
    with pytest.raises(ValueError, match="absolute path"):
        CheckpointConfig(namespace="x", fs_base="fsx/ckpt")


def test_unmounted_fs_base_fails_the_upload_with_a_clear_error_and_training_goes_on(tmp_path: Path) -> None:
    ck = _ck(tmp_path, {"fs_base": str(tmp_path / "not-mounted")}, s3_every=1)
    ck.save(state_for(1, 0), 1)
    assert ck.flush(timeout=30) is False
    assert "not a folder" in ck.failures[0].error and isinstance(ConfigError("x"), Exception)
    ck.close()


@pytest.mark.slow
def test_a_two_rank_step_in_the_filesystem_tier_reshards_onto_one_rank(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    cfg = {"keep": 2, "fs_base": str(shared), "s3_every": 2}
    res = run_ranks(tmp_path, "save", steps=[1, 2, 3, 4], cfg=cfg)
    assert [r.get("last_committed") for r in res] == [4, 4], res
    for node in ("node0", "node1"):
        shutil.rmtree(tmp_path / node)
    ck = TieredCheckpointer(
        CheckpointConfig(namespace="job1", memory_dir=str(tmp_path / "m"), replicate=False, fs_base=str(shared))
    )
    state = empty_state(0)
    state["local_1"] = empty_state(1)["local_1"]
    assert ck.load(state) == 4 and ck.last_source == "resharded"
    assert matches(state, 4, 0) and matches(state, 4, 1)
    # A flipped byte in a shard the resharding load reads: caught as it is read, the step skipped.
    shard = shared / "job1/step_0000000004/rank_1.bin"
    items = json.loads(shard.with_suffix(".idx").read_bytes())["items"]
    at = next(i["offset"] for i in items if i["fqn"] == "local_1")
    raw = bytearray(shard.read_bytes())
    raw[at + 3] ^= 0x20
    shard.write_bytes(bytes(raw))
    assert ck.load(state) == 2 and matches(state, 2, 0) and matches(state, 2, 1)
    assert len(ck.last_skipped) == 1 and "step 4 (resharded)" in ck.last_skipped[0]
    assert "checksum" in ck.last_skipped[0]
    ck.close()
