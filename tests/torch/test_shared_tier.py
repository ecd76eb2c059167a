"""Several ranks per node share one memory tier (issue 22, item 1): save, peer copy, retention and
elastic restore with 4 and 8 ranks on one memory folder, 2->4, 2->8, 8->2 and 4->2, three rounds each.

Each scenario runs in one set of rank processes (forked from a server that imported torch once: the machine has
2 cores); every phase has its own process group and a namespace per round. A simulated node is one
memory folder: rank r of a phase with `rpn` ranks per node uses `node{r // rpn}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.torch._workers import run_scenario

pytestmark = pytest.mark.slow
ROUNDS = 3
CFG = {"keep": 2}


def _ok(results: list[Any]) -> list[list[Any]]:
    for r in results:
        assert isinstance(r, list), r
    return results


def _phase_results(results: list[list[Any]], i: int, world: int) -> list[dict[str, Any]]:
    return [results[r][i] for r in range(world)]


def test_two_rank_steps_load_on_4_and_8_ranks_sharing_node_folders(tmp_path: Path) -> None:
    phases: list[dict[str, Any]] = []
    for k in range(ROUNDS):
        ns = f"grow{k}"
        phases += [
            {"ns": ns, "world": 2, "rpn": 1, "task": "save", "steps": [1, 2, 3], "cfg": CFG},
            {"ns": ns, "world": 4, "rpn": 2, "task": "load", "saved_world": 2, "cfg": CFG},
            {"ns": ns, "world": 8, "rpn": 4, "task": "load", "saved_world": 2, "cfg": CFG},
        ]
    res = _ok(run_scenario(tmp_path, phases))
    for k in range(ROUNDS):
        save, four, eight = (3 * k + i for i in range(3))
        assert [r["last_committed"] for r in _phase_results(res, save, 2)] == [3, 3]
        assert [(r["step"], r["source"], r["match"]) for r in _phase_results(res, four, 4)] == [
            (3, "resharded", True)
        ] * 4, k
        assert [(r["step"], r["match"]) for r in _phase_results(res, eight, 8)] == [(3, True)] * 8, k
    # Nothing gathered for a load is left behind in the shared folders.
    for node in ("node0", "node1"):
        restore = tmp_path / node / "grow0" / ".restore"
        assert not restore.exists() or not any(p.is_file() for p in restore.rglob("*"))


def test_eight_and_four_ranks_on_one_folder_save_prune_and_reshard_to_two(tmp_path: Path) -> None:
    phases: list[dict[str, Any]] = []
    for k in range(ROUNDS):
        phases += [
            {"ns": f"e{k}", "world": 8, "rpn": 8, "task": "save", "steps": [1, 2, 3], "cfg": CFG, "numel": 64},
            {"ns": f"e{k}", "world": 2, "rpn": 1, "task": "load", "saved_world": 8, "cfg": CFG, "numel": 64},
            {"ns": f"f{k}", "world": 4, "rpn": 4, "task": "save", "steps": [1, 2, 3], "cfg": CFG},
            {"ns": f"f{k}", "world": 4, "rpn": 4, "task": "load", "saved_world": 4, "cfg": CFG},
            {"ns": f"f{k}", "world": 2, "rpn": 2, "task": "load", "saved_world": 4, "cfg": CFG},
        ]
    res = _ok(run_scenario(tmp_path, phases))
    for k in range(ROUNDS):
        e_save, e_load, f_save, f_same, f_two = (5 * k + i for i in range(5))
        saves = _phase_results(res, e_save, 8)
        assert [r["last_committed"] for r in saves] == [3] * 8
        # keep=2 on a folder shared by 8 ranks: step 1 went once every rank had dropped its shard,
        # and each rank's shard file went to its own spare slot.
        assert all(r["spare"] for r in saves), saves
        folder = tmp_path / "node0" / f"e{k}"
        assert sorted(p.name for p in folder.glob("step_*")) == ["step_0000000002", "step_0000000003"]
        assert len(list((folder / ".spare").iterdir())) == 8
        assert [(r["step"], r["match"]) for r in _phase_results(res, e_load, 2)] == [(3, True)] * 2, k
        assert [r["last_committed"] for r in _phase_results(res, f_save, 4)] == [3] * 4
        assert [(r["step"], r["source"], r["match"]) for r in _phase_results(res, f_same, 4)] == [(3, "own", True)] * 4
        assert [(r["step"], r["match"]) for r in _phase_results(res, f_two, 2)] == [(3, True)] * 2, k


def test_peer_copies_of_four_ranks_per_node_restore_a_lost_node(tmp_path: Path) -> None:
    phases: list[dict[str, Any]] = []
    for k in range(2):
        phases += [
            {"ns": f"p{k}", "world": 8, "rpn": 4, "task": "save", "steps": [1, 2], "cfg": CFG, "numel": 64},
            {
                "ns": f"p{k}",
                "world": 8,
                "rpn": 4,
                "task": "load",
                "saved_world": 8,
                "cfg": CFG,
                "numel": 64,
                "drop": ["node1"],
            },
        ]
    # A clean end (close() without keep_tier): the job's folder goes on both nodes, once every rank of
    # the node is done with it.
    phases.append(
        {
            "ns": "end",
            "world": 8,
            "rpn": 4,
            "task": "save",
            "steps": [1, 2],
            "cfg": CFG,
            "numel": 64,
            "keep_tier": False,
        }
    )
    res = _ok(run_scenario(tmp_path, phases))
    assert [r["closed"] for r in _phase_results(res, 4, 8)] == [True] * 8
    assert not (tmp_path / "node0" / "end").exists() and not (tmp_path / "node1" / "end").exists()
    for k in range(2):
        assert [r["flushed"] for r in _phase_results(res, 2 * k, 8)] == [True] * 8
        got = _phase_results(res, 2 * k + 1, 8)
        assert [(r["step"], r["source"], r["match"]) for r in got] == [(2, "own", True)] * 4 + [
            (2, "peer", True)
        ] * 4, k
