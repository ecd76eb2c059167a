"""A 2-rank checkpoint restores on 1, 2 and 4 ranks through TieredCheckpointer.load() (issue 17, item 1).

Memory tier first (each rank gathers the saved shards it lacks from the nodes holding them), S3 when the
memory tiers are gone. Gloo on 127.0.0.1, one memory-tier folder per simulated node.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpresilience.torch.elastic import needed_ranks
from tests.torch._workers import empty_state, run_ranks

pytestmark = pytest.mark.slow


def _ok(results: list[dict[str, object]]) -> list[dict[str, object]]:
    for r in results:
        assert "error" not in r and "exitcode" not in r, r
    return results


def _cfg(s3_endpoint: str) -> dict[str, object]:
    return {"keep": 2, "s3_base": "s3://ckpt/elastic", "s3_endpoint_url": s3_endpoint}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Path:
    """Steps 1..3 saved by 2 ranks on 2 'nodes'; step 2 also in S3."""
    base = tmp_path_factory.mktemp("saved2")
    cfg = {**_cfg(s3_endpoint), "s3_every": 2}
    res = _ok(run_ranks(base, "save", steps=[1, 2, 3], cfg=cfg))
    assert [r["last_committed"] for r in res] == [3, 3]
    return base


@pytest.fixture()
def cluster(saved: Path, tmp_path: Path) -> Iterator[Path]:
    dst = tmp_path / "c"
    shutil.copytree(saved, dst)
    yield dst


@pytest.mark.parametrize("world", [1, 2, 4])
def test_two_rank_step_loads_on_1_2_and_4_ranks_from_memory(cluster: Path, s3_endpoint: str, world: int) -> None:
    res = _ok(run_ranks(cluster, "load_resharded", world=world, saved_world=2, cfg=_cfg(s3_endpoint)))
    assert [(r["step"], r["match"]) for r in res] == [(3, True)] * world
    want = "own" if world == 2 else "resharded"
    assert {r["source"] for r in res} == {want}
    assert not any(r.get("restore_left") for r in res)  # gathered shards are dropped after the load


@pytest.mark.parametrize("world", [1, 4])
def test_two_rank_step_loads_on_1_and_4_ranks_from_s3_when_memory_is_gone(
    cluster: Path, s3_endpoint: str, world: int
) -> None:
    for d in cluster.glob("node*"):
        shutil.rmtree(d)
    res = _ok(run_ranks(cluster, "load_resharded", world=world, saved_world=2, cfg=_cfg(s3_endpoint)))
    assert [(r["step"], r["match"]) for r in res] == [(2, True)] * world


def test_each_new_rank_gathers_only_the_saved_shards_its_state_asks_for(saved: Path) -> None:
    """DCP's own load planning says which saved shards hold the keys asked for; only those are fetched."""
    md = saved / "node0/job1/step_0000000003/.metadata"
    probe = empty_state(1)
    del probe["shared"], probe["meta"]
    assert needed_ranks({"local_1": probe["local_1"]}, md, 2) == {1}
    assert needed_ranks(None, md, 2) == {0, 1}
    assert needed_ranks({"local_0": empty_state(0)["local_0"], "local_1": probe["local_1"]}, md, 2) == {0, 1}


def test_four_new_ranks_each_loading_one_saved_part(cluster: Path, s3_endpoint: str) -> None:
    res = _ok(run_ranks(cluster, "load_part", world=4, saved_world=2, cfg=_cfg(s3_endpoint)))
    assert [(r["step"], r["match"]) for r in res] == [(3, True)] * 4
