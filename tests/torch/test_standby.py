"""Warm standby ranks (hpresilience/torch/standby.py, issue 33 item 4): a rank started ahead of any fault, with no
rank, that waits in the loop's start until a world names its node, then is that world's new rank."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from hpresilience.torch.standby import await_assignment
from hpresilience.torch.world import Placement, World, write_world
from tests.torch.localworld import LocalWorld, digests, fault_free_digest, joined

STEPS = 12
STANDBY_ENV = {"HPR_WORLD_FILE": "/x/w.json", "HPR_STANDBY_NODE": "s1", "SLURM_LOCALID": "1", "HPR_GENERATION": "2"}


def test_a_standbys_placement_has_its_node_and_no_rank_until_a_newer_world_names_the_node() -> None:
    standby = Placement.from_env({**STANDBY_ENV, "HPR_RANK_BASE": "6"})  # a stale base from the batch env: ignored
    assert (standby.standby_node, standby.generation, standby.rank) == ("s1", 2, 1)
    assert not standby.assignment(World(2, ("n1", "s1"), "h", 1, 2))  # not newer than the one it started beside
    assert not standby.assignment(World(3, ("n1", "n2"), "h", 1, 2))  # newer, but its node has no slot
    named = World(3, ("n1", "s1", "n3"), "h", 29501, 2, (2, 3))
    assert standby.assignment(named)
    mine = standby.assigned(named)
    assert (mine.rank_base, mine.rank, mine.generation, mine.standby_node) == (2, 3, 3, "")


def test_a_standby_waits_for_its_assignment_then_takes_the_ranks_variables_from_the_world(tmp_path: Path) -> None:
    """It blocks while the world file names other nodes only, and returns within a poll of the world naming it,
    with RANK, HPR_RANK_BASE, WORLD_SIZE, MASTER_* as a rank launched into that world has them."""
    path = tmp_path / "w.json"
    write_world(path, World(1, ("n1", "n2"), "h", 29500, 2))
    env = {**STANDBY_ENV, "HPR_WORLD_FILE": str(path), "HPR_GENERATION": "1"}
    lines: list[str] = []
    written: list[float] = []

    def assign() -> None:
        time.sleep(0.5)
        write_world(path, World(2, ("n1", "n2"), "h", 29501, 2))  # a newer world without s1: still waiting
        time.sleep(0.5)
        written.append(time.time())
        write_world(path, World(3, ("s1", "n2"), "10.0.0.3", 29502, 2, (0, 1)))

    writer = threading.Thread(target=assign)
    writer.start()
    placement, world, seen = await_assignment(Placement.from_env(env), lines.append, env=env, deadline=None)
    writer.join()
    assert world.generation == 3 and (placement.rank, placement.generation) == (1, 3)
    assert 0 <= seen - written[0] < 0.5
    assert {k: env[k] for k in ("RANK", "HPR_RANK_BASE", "HPR_GENERATION", "WORLD_SIZE", "MASTER_PORT")} == {
        "RANK": "1",
        "HPR_RANK_BASE": "0",
        "HPR_GENERATION": "3",
        "WORLD_SIZE": "4",
        "MASTER_PORT": "29502",
    }
    assert "HPR_STANDBY_NODE" not in env and env["NODE_LIST"] == "s1,n2" and env["MASTER_ADDR"] == "10.0.0.3"
    assert lines[0].startswith("hpr-inprocess standby node=s1 local=1 ") and "after_generation=1" in lines[0]
    assert lines[1].startswith("hpr-inprocess assigned node=s1 rank=1 ") and "generation=3" in lines[1]


def test_a_standby_that_is_never_named_times_out_when_given_a_deadline(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    write_world(path, World(1, ("n1",), "h", 29500, 1))
    env = {**STANDBY_ENV, "HPR_WORLD_FILE": str(path), "HPR_GENERATION": "1"}
    with pytest.raises(TimeoutError, match="s1"):
        await_assignment(Placement.from_env(env), lambda _: None, env=env, deadline=time.monotonic() + 0.3)


def test_a_standby_started_before_the_fault_becomes_the_lost_rank_and_the_weights_equal_the_fault_free_runs(
    tmp_path: Path,
) -> None:
    """examples/checkpointless/train.py unchanged, on 4 ranks plus a standby on node "s": the standby imports
    torch and builds the model while the 4 train (it is in no world: world 1 has 4 ranks and trains without it),
    rank 3 dies after step 5, the next world gives slot 3 to "s": the standby's own process joins as rank 3
    with its state from rank 0, and the final weights equal the fault-free run's bit for bit."""
    reference = fault_free_digest(tmp_path / "reference", 4, STEPS)
    work = tmp_path / "job"
    work.mkdir()
    world = LocalWorld(work, 4, {"TRAIN_STEPS": str(STEPS), "STEP_SLEEP": "0.1"}, nodes=("n0", "n1", "n2", "n3"))
    first = {rank: world.start(rank, {"DIE_RANK": "3", "DIE_STEP": "5"}) for rank in range(4)}
    standby = world.start_standby("s", 3)
    try:
        assert first[3].wait(180) == 1
        assert standby.poll() is None  # waited through world 1 without a rank
        world.announce((3,), nodes=("n0", "n1", "n2", "s"))
    finally:
        codes = world.finish()  # kills what is left: a standby never named would wait for good
    out = world.output()
    assert set(codes.values()) == {0}, out
    waiting = re.search(r"^hpr-inprocess standby node=s local=0 pid=(\d+) .*at=([\d.]+)$", out, re.MULTILINE)
    assert waiting is not None and int(waiting[1]) == standby.pid, out
    second = {int(j["rank"]): j for j in joined(out) if j["generation"] == "2"}
    assert int(second[3]["pid"]) == standby.pid and second[3]["state_from"] == "0", out
    assert {int(second[r]["pid"]) for r in (0, 1, 2)} == {first[r].pid for r in (0, 1, 2)}
    assert [j["world_size"] for j in joined(out)] == ["4"] * 8  # the standby never counted in a world of 5
    assert set(digests(out).values()) == {reference} and sorted(digests(out)) == [0, 1, 2, 3], out
    done = [int(s) for s in re.findall(r"^step=(\d+) ", out, re.MULTILINE)]
    assert done == list(range(1, STEPS + 1)), done
