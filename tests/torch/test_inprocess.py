"""The in-process recovery loop (hpresilience/torch/inprocess.py) with real gloo process groups on localhost, and
the world file it reads (hpresilience/torch/world.py)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from hpresilience.torch.world import Placement, World, WorldFileError, read_world, write_world
from tests.torch.localworld import LocalWorld, digests, fault_free_digest, joined

STEPS = 12


# -- the world file ----------------------------------------------------------------------------------------
def test_a_written_world_reads_back_the_same_with_its_world_size(tmp_path: Path) -> None:
    world = World(3, ("n1", "n3"), "127.0.0.11", 29611, 2, (2, 3))
    write_world(tmp_path / "w.json", world)
    back = read_world(tmp_path / "w.json")
    assert back == world and back.world_size == 4
    assert json.loads((tmp_path / "w.json").read_text())["world_size"] == 4
    assert (tmp_path / "w.json").stat().st_mode & 0o777 == 0o600


def test_no_world_file_yet_reads_as_none(tmp_path: Path) -> None:
    assert read_world(tmp_path / "absent.json") is None


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"generation": 0, "nodes": ["a"], "master_addr": "h", "master_port": 1, "tasks_per_node": 1}',
        '{"generation": 1, "nodes": [], "master_addr": "h", "master_port": 1, "tasks_per_node": 1}',
        '{"generation": 1, "nodes": ["a"], "master_addr": "", "master_port": 1, "tasks_per_node": 1}',
        '{"generation": 1, "nodes": ["a"], "master_addr": "h", "master_port": 70000, "tasks_per_node": 1}',
        '{"generation": true, "nodes": ["a"], "master_addr": "h", "master_port": 1, "tasks_per_node": 1}',
        '{"generation": 1, "nodes": ["a"], "master_addr": "h", "master_port": 1, "tasks_per_node": 2, "world_size": 3}',
        '{"generation": 1, "nodes": ["a"], "master_addr": "h", "master_port": 1, "tasks_per_node": 1, '
        '"new_ranks": [1]}',
        '{"generation": 1, "nodes": ["a"], "master_addr": "h", "master_port": 1, "tasks_per_node": 1, '
        '"new_ranks": [-1]}',
    ],
)
def test_a_malformed_world_file_is_refused_with_a_clear_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "w.json").write_text(text)
    with pytest.raises(WorldFileError, match="world file"):
        read_world(tmp_path / "w.json")


def test_a_ranks_place_is_its_nodes_rank_base_plus_its_local_id() -> None:
    env = {"HPR_WORLD_FILE": "/x/w.json", "HPR_RANK_BASE": "4", "SLURM_LOCALID": "1", "HPR_GENERATION": "2"}
    placement = Placement.from_env(env)
    assert (placement.rank, placement.generation, placement.world_file) == (5, 2, "/x/w.json")
    with pytest.raises(WorldFileError, match="HPR_WORLD_FILE"):
        Placement.from_env({})


def test_without_a_world_file_the_relaunch_paths_variables_give_the_one_world() -> None:
    """After a fallback the relaunch path starts the ranks: the same training code must run there."""
    env = {"NODE_LIST": "n1,n3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29650", "NTASKS_PER_NODE": "2"}
    placement = Placement.from_env({**env, "SLURM_PROCID": "3"})
    assert placement.rank == 3 and placement.world_file == ""
    assert placement.fixed == World(1, ("n1", "n3"), "10.0.0.1", 29650, 2)
    with pytest.raises(WorldFileError, match="outside"):
        Placement.from_env({**env, "SLURM_PROCID": "4"})


# -- the loop, with real gloo groups ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return fault_free_digest(tmp_path_factory.mktemp("reference"), 4, STEPS)


@pytest.mark.slow  # several ranks, each importing torch
def test_a_lost_rank_is_replaced_in_process_and_the_final_weights_equal_the_fault_free_runs(
    tmp_path: Path, reference: str
) -> None:
    """Rank 3 dies after step 5; the survivors keep their processes, the replacement gets model and optimizer
    (Adam's moments too) from rank 0 over the new group; no step is done twice; same weights bit for bit."""
    world = LocalWorld(tmp_path, 4, {"TRAIN_STEPS": str(STEPS), "STEP_SLEEP": "0.1"})
    first = {rank: world.start(rank, {"DIE_RANK": "3", "DIE_STEP": "5"}) for rank in range(4)}
    assert first[3].wait(180) == 1
    world.announce((3,))
    world.start(3)
    codes = world.finish()
    out = world.output()
    assert set(codes.values()) == {0}, out
    assert set(digests(out).values()) == {reference} and len(digests(out)) == 4, out
    second = {int(j["rank"]): j for j in joined(out) if j["generation"] == "2"}
    assert second[3]["state_from"] == "0" and second[3]["cause"] == "start"
    assert {int(second[r]["pid"]) for r in (0, 1, 2)} == {first[r].pid for r in (0, 1, 2)}  # survivors kept
    assert all(second[r]["state_from"] == "-" for r in (0, 1, 2))
    # Rank 0's progress: every step exactly once (nothing rolled back, nothing skipped).
    done = [int(s) for s in re.findall(r"^step=(\d+) ", out, re.MULTILINE)]
    assert done == list(range(1, STEPS + 1)), done


@pytest.mark.slow  # several ranks, each importing torch
def test_a_rank_one_step_behind_applies_the_averaged_gradients_of_a_rank_that_completed_it(tmp_path: Path) -> None:
    """The step agreement alone: rank 1 is held back one step (its all-reduce 'failed' after the others'
    completed, as a ring all-reduce can end), rank 2 is new. After the new world all three hold the same
    weights at the end: the laggard applied step 5's averaged gradients (no rollback, no step computed twice)
    and the new rank took the state of step 5."""
    world = LocalWorld(tmp_path, 3, {"TRAIN_STEPS": str(STEPS), "STEP_SLEEP": "0"}, script=LAGGARD)
    for rank in range(3):
        world.start(rank)
    codes = world.finish()
    out = world.output()
    assert set(codes.values()) == {0}, out
    assert len(set(digests(out).values())) == 1, out
    lines = {int(j["rank"]): j for j in joined(out) if j["generation"] == "2"}
    assert lines[1]["grads_from"] == "0" and lines[2]["state_from"] == "0", out
    assert lines[0]["step"] == lines[1]["step"] == lines[2]["step"] == "5", out


LAGGARD = Path(__file__).with_name("inprocess_laggard.py")


@pytest.mark.slow  # several ranks, each importing torch
def test_a_rank_that_sees_no_new_world_within_the_bound_gives_up_with_the_fallback_code(tmp_path: Path) -> None:
    world = LocalWorld(tmp_path, 2, {"TRAIN_STEPS": "50", "STEP_SLEEP": "0.05", "HPR_WORLD_WAIT_S": "3"})
    first = {rank: world.start(rank, {"DIE_RANK": "1", "DIE_STEP": "3"}) for rank in range(2)}
    started = time.monotonic()
    assert first[1].wait(180) == 1
    assert first[0].wait(180) == 86, world.output()
    assert time.monotonic() - started < 170
    assert "hpr-inprocess gave_up rank=0" in world.output()


@pytest.fixture(scope="module")
def reference3(tmp_path_factory: pytest.TempPathFactory) -> str:
    return fault_free_digest(tmp_path_factory.mktemp("reference3"), 3, STEPS)


def ranks_at_store(world: World, count: int, timeout: float) -> None:
    """Wait until `count` ranks have come to `world`'s store (rank 0 serves it): they wait there for the rest."""
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    from hpresilience.torch.joining import JOINED_KEY

    deadline = time.monotonic() + timeout
    while True:
        try:
            store = TCPStore(world.master_addr, world.master_port, world.world_size, False, timedelta(seconds=5))
            if store.add(JOINED_KEY, 0) >= count:
                return
        except RuntimeError:
            pass  # rank 0's store not up yet
        assert time.monotonic() < deadline, f"{count} ranks did not come to generation {world.generation}'s store"
        time.sleep(0.2)


@pytest.mark.slow  # several ranks, each importing torch
def test_ranks_waiting_in_a_world_the_wrapper_replaced_leave_it_at_once_for_the_newer_one(
    tmp_path: Path, reference3: str
) -> None:
    """Rank 2 dies; generation 2 is written but its new rank never comes (Slurm killed it as it started); the
    wrapper then writes generation 3 and starts the rank there. The survivors, waiting in generation 2 for it,
    leave that world as soon as generation 3 is written (inside gloo's own rendezvous they waited out the
    collective timeout), keep their processes, and the run ends with the fault-free weights."""
    world = LocalWorld(tmp_path, 3, {"TRAIN_STEPS": str(STEPS), "STEP_SLEEP": "0.1"})
    first = {rank: world.start(rank, {"DIE_RANK": "2", "DIE_STEP": "5"}) for rank in range(3)}
    assert first[2].wait(180) == 1
    ranks_at_store(world.announce((2,)), 2, 120)  # its rank 2 is never started
    world.announce((2,))
    world.start(2)
    codes = world.finish()
    out = world.output()
    assert set(codes.values()) == {0}, out
    left = re.findall(r"^hpr-inprocess join_failed rank=(\d) generation=2 err=(.*)$", out, re.MULTILINE)
    assert sorted(r for r, _ in left) == ["0", "1"], out
    # The first to see generation 3 leaves; a rank still waiting on that rank's store then sees it close. None
    # waited for its wait to run out.
    assert any("was replaced while joining it" in err for _, err in left), left
    assert not any("timeout" in err.lower() or "timed out" in err.lower() for _, err in left), left
    third = {int(j["rank"]): j for j in joined(out) if j["generation"] == "3"}
    assert {int(third[r]["pid"]) for r in (0, 1)} == {first[r].pid for r in (0, 1)}, out
    assert third[2]["state_from"] == "0", out
    assert set(digests(out).values()) == {reference3} and len(digests(out)) == 3, out
