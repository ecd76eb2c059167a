"""Shards and the fallback of the in-process loop (hpresilience/torch/inprocess.py), with real gloo groups on
localhost: a lost shard with no surviving replica makes every rank give up (the fallback code), a lost shard
with a surviving replica is recovered from it, and the relaunch path's ranks then resume from the checkpoint
to the fault-free run's weights; the formed-world report rank 0 writes (worldreport.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpresilience.torch.world import EXIT_INPROCESS_GAVE_UP, WorldFileError
from hpresilience.torch.worldreport import Formed, read_formed, report_path
from tests.torch.localworld import PORT_BASE, REPO, LocalWorld, digests, joined

SCRIPT = REPO / "examples" / "checkpointless" / "train_fallback.py"
STEPS = 20


def relaunch(world: LocalWorld, rank: int, port: int) -> subprocess.Popen[bytes]:
    """A rank as the relaunch path starts it (no world file: NODE_LIST, MASTER_*, SLURM_PROCID)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPR_")}
    env.update(world.env)
    env.update(
        {
            "NODE_LIST": ",".join(f"n{i}" for i in range(world.size)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "NTASKS_PER_NODE": "1",
            "SLURM_PROCID": str(rank),
        }
    )
    log = world.tmp / f"rank{rank}-relaunch.log"
    world.logs[(rank, 1000)] = log
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(SCRIPT)], env=env, stdout=out, stderr=subprocess.STDOUT)
    world.procs[rank] = proc
    return proc


def sharded(tmp: Path, steps: int, sleep: str) -> LocalWorld:
    env = {"TRAIN_STEPS": str(steps), "STEP_SLEEP": sleep, "CKPT_DIR": str(tmp / "ckpt"), "SHARD_BLOCK": "2"}
    return LocalWorld(tmp, 4, env, script=SCRIPT)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    world = sharded(tmp_path_factory.mktemp("reference"), STEPS, "0")
    for rank in range(4):
        world.start(rank)
    assert set(world.finish().values()) == {0}, world.output()
    found = digests(world.output())
    assert found[0] == found[1] != found[2] == found[3], found  # two shards, two replicas each
    return found


@pytest.mark.timeout(900)  # three rounds of process starts (torch imports): minutes on a loaded machine
def test_a_shard_whose_every_holder_is_lost_makes_every_rank_give_up_and_the_relaunch_resumes_from_the_checkpoint(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    """Ranks 2 and 3 (shard 1's only replicas, one node) die at step 7; the new world has new ranks 2 and 3 and
    the survivors 0 and 1 (shard 0): all four see that no survivor holds shard 1 and exit 86 together. The
    relaunch path's ranks restore step 5 (the newest step every rank saved) and end with the fault-free
    weights, each shard its own."""
    world = sharded(tmp_path, STEPS, "0.1")
    first = {rank: world.start(rank, {"DIE_RANKS": "2,3", "DIE_STEP": "7"}) for rank in range(4)}
    assert first[2].wait(180) == 1 and first[3].wait(180) == 1, world.output()
    world.announce((2, 3))
    world.start(2)
    world.start(3)
    codes = world.finish()
    out = world.output()
    assert set(codes.values()) == {EXIT_INPROCESS_GAVE_UP}, out
    gave_up = dict(re.findall(r"^hpr-inprocess gave_up rank=(\d+) why=(.*)$", out, re.MULTILINE))
    assert sorted(gave_up) == ["0", "1", "2", "3"], out
    assert all("no survivor holds a replica of shard 1 (its ranks 2,3 are all new)" in w for w in gave_up.values())
    for rank in range(4):
        relaunch(world, rank, PORT_BASE + 50)
    assert set(world.finish().values()) == {0}, world.output()
    out = world.output()
    assert re.findall(r"^restored rank=\d step=(\d+)$", out, re.MULTILINE) == ["5"] * 4, out
    assert digests(out) == reference, out


@pytest.mark.timeout(600)
def test_a_lost_replica_of_a_shard_is_rebuilt_from_its_surviving_replica_not_from_another_shard(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    """Rank 3 dies; shard 1 still has rank 2: the new rank 3 takes its state from rank 2 (its shard's replica,
    not rank 0, which holds other weights) and the job ends in-process with the fault-free weights."""
    world = sharded(tmp_path, STEPS, "0.1")
    first = {rank: world.start(rank, {"DIE_RANKS": "3", "DIE_STEP": "7"}) for rank in range(4)}
    assert first[3].wait(180) == 1, world.output()
    world.announce((3,))
    world.start(3)
    codes = world.finish()
    out = world.output()
    assert set(codes.values()) == {0}, out
    second = {int(j["rank"]): j for j in joined(out) if j["generation"] == "2"}
    assert second[3]["state_from"] == "2", out
    assert digests(out) == reference, out
    formed = read_formed(world.world_file)  # rank 0's report of generation 2, after its first step
    assert formed is not None and formed.generation == 2 and formed.state_to == 1, formed
    assert all(v >= 0 for v in formed.parts().values()), formed


@pytest.mark.slow  # several ranks, each importing torch
def test_a_replacement_whose_model_differs_from_its_peers_makes_every_rank_give_up_naming_the_tensor(
    tmp_path: Path,
) -> None:
    """The replacement's model is wider than the survivors' (changed code or config on the shared file system):
    it refuses the survivor's state before a byte is sent, and every rank gives up together with the fallback
    code, the survivor saying which rank refused and why; nobody trains on with half a model."""
    world = LocalWorld(
        tmp_path,
        2,
        {"TRAIN_STEPS": "40", "STEP_SLEEP": "0.02"},
        script=REPO / "examples" / "checkpointless" / "train.py",
    )
    first = {rank: world.start(rank, {"DIE_RANK": "1", "DIE_STEP": "3"}) for rank in range(2)}
    assert first[1].wait(180) == 1
    world.announce((1,))
    world.start(1, {"HIDDEN": "33"})
    codes = world.finish()
    out = world.output()
    assert codes == {0: EXIT_INPROCESS_GAVE_UP, 1: EXIT_INPROCESS_GAVE_UP}, out
    why = (
        "rank 1 cannot take rank 0's state: 0.weight: (33, 16) torch.float32 here, (32, 16) torch.float32 at the source"
    )
    assert f"hpr-inprocess gave_up rank=1 why={why!r}" in out, out
    assert """hpr-inprocess gave_up rank=0 why="a new rank refused its peer's state""" in out, out


def test_a_formed_world_report_reads_back_and_a_malformed_one_is_refused(tmp_path: Path) -> None:
    world = tmp_path / "w.json"
    formed = Formed(2, 7, "new_world", 10.0, 10.5, 12.0, 12.25, 12.5, state_to=2)
    from hpresilience.torch.worldreport import write_formed

    write_formed(world, formed)
    assert read_formed(world) == formed
    assert formed.parts() == {"teardown_s": 0.5, "new_world_s": 1.5, "state_transfer_s": 0.25, "first_step_s": 0.25}
    Path(report_path(world)).write_text(formed.to_json().replace('"joined_at": 12.0', '"joined_at": 9.0'))
    with pytest.raises(WorldFileError, match="not in order"):
        read_formed(world)
    Path(report_path(world)).write_text('{"generation": 1}')
    with pytest.raises(WorldFileError, match="formed-world report"):
        read_formed(world)
