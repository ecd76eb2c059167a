"""What the ranks of a new world decide from their exchanged table (hpresilience/torch/agreement.py)."""

from __future__ import annotations

import pytest

from hpresilience.torch.agreement import NEW, GaveUp, shard_holders, state_pairs


def test_a_replaced_nodes_ranks_take_their_state_from_different_survivors() -> None:
    done = {0: 9, 1: 9, 2: NEW, 3: NEW, 4: 9, 5: 9}
    assert state_pairs(list(done), done, 9) == {2: 0, 3: 1}


def test_more_receivers_than_survivors_are_dealt_round_and_a_rank_more_than_a_step_behind_sends_nothing() -> None:
    done = {0: 9, 1: 7, 2: NEW, 3: NEW, 4: 3}  # rank 1 is two steps behind: it receives too
    assert state_pairs(list(done), done, 9) == {1: 0, 2: 0, 3: 0, 4: 0}
    done = {0: 9, 1: 9, 2: NEW, 3: NEW, 4: NEW}
    assert state_pairs(list(done), done, 9) == {2: 0, 3: 1, 4: 0}


def test_a_survivor_one_step_behind_catches_up_by_the_gradients_and_is_dealt_receivers_as_one_at_the_top() -> None:
    done = {0: 9, 1: 8, 2: NEW, 3: NEW}
    assert state_pairs(list(done), done, 9) == {2: 0, 3: 1}
    done = {0: 0, 1: NEW, 2: NEW}  # at step 0 nobody is behind: NEW is not "one step behind"
    assert state_pairs(list(done), done, 0) == {1: 0, 2: 0}


def test_a_world_where_every_rank_is_at_the_top_step_passes_no_state() -> None:
    done = {0: 4, 1: 4}
    assert state_pairs(list(done), done, 4) == {}


def test_a_shard_whose_every_holder_is_new_gives_up_naming_the_shard() -> None:
    with pytest.raises(GaveUp, match="shard 1"):
        shard_holders({0: 0, 1: 1, 2: 1}, {0: 5, 1: NEW, 2: NEW})
