"""A warm standby rank waits for its assignment (issue 33, `--auto-resume-mode=inprocess` with hot spares).

The wrapper starts a step on each hot spare ahead of any fault (autoresume/launch/standby.py) with
HPR_STANDBY_NODE in place of HPR_RANK_BASE. Its tasks run the same training code as every rank: they import torch,
build the model and the optimizer, and then block in InProcessLoop's start (hpresilience/torch/inprocess.py)
here, reading the world file, until the wrapper writes a world that names their node. That world is their
assignment: the node's slot gives their ranks, the world's generation is the one they are born into (new ranks:
their state comes from a peer), and the rank variables are set from it (world.assignment_env), so that code after
the loop's start, and what it starts, sees a rank like any other.

Until then a standby is in no world: it is not counted in any world size and joins no collective; it reads one
small file (a stat every WAIT_POLL_S, the file read only when it changed). It ends with its step: the wrapper
cancels it when the job ends or falls back to the relaunch path, Slurm when the job goes. Torch-free.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, MutableMapping

from hpresilience.torch.world import (
    STANDBY_NODE_VAR,
    Placement,
    World,
    WorldFileError,
    assignment_env,
    read_world,
)

# How often a standby looks at the world file: its share of the fault -> training again time.
WAIT_POLL_S = 0.02


class StandbyError(WorldFileError):
    """The world file could not be read while waiting for an assignment."""


def await_assignment(
    placement: Placement,
    say: Callable[[str], None],
    *,
    env: MutableMapping[str, str] | None = None,
    deadline: float | None = None,
) -> tuple[Placement, World, float]:
    """Block until a world names this standby's node; its placement in that world, the world, and the wall-clock
    time the assignment was seen. `env` (default: os.environ) takes the assigned rank's variables; `deadline`
    (monotonic; None: wait as long as the step runs) raises TimeoutError."""
    env = os.environ if env is None else env
    say(
        f"hpr-inprocess standby node={placement.standby_node} local={placement.local_rank} pid={os.getpid()} "
        f"after_generation={placement.generation} at={time.time():.3f}"
    )
    seen: tuple[int, int, int] | None = None
    started = time.monotonic()
    while True:
        world = _newer(placement.world_file, seen)
        if world is not None:
            seen, found = world
            if placement.assignment(found):
                break
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no world named node {placement.standby_node} in time")
        time.sleep(WAIT_POLL_S)
    now = time.time()
    mine = placement.assigned(found)
    env.update(assignment_env(mine, found))
    env.pop(STANDBY_NODE_VAR, None)
    say(
        f"hpr-inprocess assigned node={placement.standby_node} rank={mine.rank} pid={os.getpid()} "
        f"generation={found.generation} waited_s={time.monotonic() - started:.3f} at={now:.3f}"
    )
    return mine, found, now


def _newer(path: str, seen: tuple[int, int, int] | None) -> tuple[tuple[int, int, int], World] | None:
    """The world in the file when the file changed since `seen` (mtime, size, inode), else None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StandbyError(f"world file {path}: {err}") from None
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    if stamp == seen:
        return None
    try:
        world = read_world(path)
    except OSError as err:
        raise StandbyError(f"world file {path}: {err}") from None
    return None if world is None else (stamp, world)
