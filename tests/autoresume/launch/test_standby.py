"""A warm standby's step environment (hpresilience/autoresume/launch/standby.py): the library's Placement reads it
as a standby, with no rank, waiting beyond the world current at its launch."""

from __future__ import annotations

from hpresilience.autoresume.launch.pernode import node_step_env
from hpresilience.autoresume.launch.standby import standby_step_env
from hpresilience.torch.world import Placement, World


def test_a_standbys_step_env_has_its_node_and_no_rank_and_its_placement_waits_beyond_the_current_world() -> None:
    base = {"PATH": "/bin", "HPR_RANK_BASE": "2", "NODE_LIST": "n1,n2"}  # a stale base: not the standby's
    env = standby_step_env(base, "/s/7.world.json", "n3", 4)
    assert "HPR_RANK_BASE" not in env and env["HPR_STANDBY_NODE"] == "n3" and env["HPR_GENERATION"] == "4"
    placement = Placement.from_env({**env, "SLURM_LOCALID": "1"})
    assert placement.standby_node == "n3" and placement.world_file == "/s/7.world.json"
    assert not placement.assignment(World(4, ("n1", "n2"), "h", 1, 2))
    assert placement.assigned(World(5, ("n1", "n3"), "h", 1, 2, (2, 3))).rank == 3
    # A step launched into a world (not a standby) is placed at once, as before.
    assert Placement.from_env({**node_step_env(base, "/w", 1, 2, 5), "SLURM_LOCALID": "0"}).standby_node == ""
