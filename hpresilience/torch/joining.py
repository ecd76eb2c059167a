"""Joining a new world's process group (hpresilience/torch/inprocess.py): rank 0 opens the world's TCPStore,
every rank comes to it, and the group is built only once all of them have; until then each rank keeps looking at
the world file, and a world the wrapper replaced meanwhile is left at once for the newer one.

Inside gloo's own rendezvous (`init_method=tcp://...`) a rank waits for missing ranks the whole collective
timeout: seen on the devcluster, survivors held 60 s in a world whose new ranks Slurm had killed as they
started, while the wrapper had written the next world 10 s after that one.
"""

from __future__ import annotations

import datetime
import socket
import time
from collections.abc import Callable

from torch.distributed import TCPStore  # type: ignore[attr-defined]

from hpresilience.torch.world import World

STORE_POLL_S = 0.01  # between looks for rank 0's store on a new world's port
# A rank that waits for the rest of its world looks at the store, then at the world file, every LOOK_S: what
# forming a world and leaving a replaced one can cost. Larger worlds look less often, so that rank 0's store gets
# at most STORE_LOOKS_PER_S requests a second from the waiting ranks whatever the world's size (16k ranks: 0.8 s).
# (A blocking store.wait() with a short timeout instead makes torch print a warning at every timeout.)
LOOK_S = 0.05
STORE_LOOKS_PER_S = 20_000
JOINED_KEY, ALL_JOINED_KEY = "hpr/joined", "hpr/all-joined"


class WorldReplaced(RuntimeError):
    """The wrapper wrote a newer world while this rank was joining one."""


def open_store(world: World, rank: int, timeout: datetime.timedelta, moved: Callable[[], bool]) -> TCPStore:
    """The world's store (rank 0 serves it), once every rank of the world has come to it. WorldReplaced when
    `moved()` says a newer world was written meanwhile; TimeoutError past `timeout`; a store that went away (its
    rank 0 lost too) raises torch's DistNetworkError (a RuntimeError)."""
    if rank != 0:
        _await_listener(world, timeout.total_seconds(), moved)
    store = TCPStore(
        world.master_addr,
        world.master_port,
        world.world_size,
        is_master=rank == 0,
        timeout=timeout,
        wait_for_workers=False,
    )
    if store.add(JOINED_KEY, 1) >= world.world_size:
        store.set(ALL_JOINED_KEY, "1")
    deadline = time.monotonic() + timeout.total_seconds()
    look = max(LOOK_S, world.world_size / STORE_LOOKS_PER_S)
    while not store.check([ALL_JOINED_KEY]):
        if moved():
            raise WorldReplaced(f"generation {world.generation} was replaced while joining it")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank came to generation {world.generation} within {timeout}")
        time.sleep(look)
    return store


def _await_listener(world: World, timeout_s: float, moved: Callable[[], bool]) -> None:
    """Wait, looking every STORE_POLL_S, until rank 0's TCPStore listens on the new port. A TCPStore client
    that finds no listener backs off for about 1.5 s before it tries again (torch 2.13 here), and when every
    rank joins at once (a warm standby's world) most of them come before rank 0's store: that backoff was
    most of the join. A newer world while waiting (rank 0's node lost too) ends the wait: that one is joined."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((world.master_addr, world.master_port), timeout=1.0).close()
            return
        except OSError:
            if moved():
                raise WorldReplaced(f"generation {world.generation} was replaced while joining it") from None
            time.sleep(STORE_POLL_S)
