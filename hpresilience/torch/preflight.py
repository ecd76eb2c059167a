"""The preflight's task (`python -m hpresilience.torch.preflight`): one per node of a new node set, run by the
wrapper before a relaunch onto nodes that did not run the previous attempt (autoresume/decide/preflight.py).

Rank 0 is the hub, a node that ran the previous attempt (so known to communicate): it holds the store, waits up to
half the bound for every node to join, runs one gloo all-reduce, then sends a few MB to every other node at once
and times each one's acknowledgement. It prints one line per finding (`hpr-preflight joined|missing|allreduce|
transfer|slow|done ...`), flushed as it goes, so that whatever it printed before a kill is still evidence. Every
task ends by itself at the bound (os._exit: a gloo peer that never answers would block a clean shutdown).

Environment: HPR_PREFLIGHT_NODES (the node names, hub first), HPR_PREFLIGHT_ADDR / _PORT (the hub's store),
HPR_PREFLIGHT_BOUND_S, HPR_PREFLIGHT_MB, HPR_PREFLIGHT_GIVE_UP_S (a transfer not acknowledged by then is
already slower than the wrapper accepts: no need to wait for the bound); the node's own name is Slurm's SLURMD_NODENAME.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from datetime import timedelta

PREFIX = "hpr-preflight"
POLL_S = 0.01


def say(what: str, **fields: object) -> None:
    words = " ".join(f"{k}={v}" for k, v in fields.items())
    sys.stdout.write(f"{PREFIX} {what} {words}".rstrip() + "\n")
    sys.stdout.flush()


def _wait_all(works: Mapping[int, object], deadline: float, started: float) -> dict[int, float]:
    """Each work's completion time (seconds since `started`), for those done by the deadline. Gloo's send/recv
    works complete only inside wait(), so each is waited for in a daemon thread (one left blocked is dropped by
    the task's os._exit)."""
    done: dict[int, float] = {}

    def wait(r: int, w: object) -> None:
        w.wait()  # type: ignore[attr-defined]
        done[r] = time.monotonic() - started

    for r, w in works.items():
        threading.Thread(target=wait, args=(r, w), daemon=True).start()
    while len(done) < len(works) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return dict(done)


def hub(nodes: list[str], addr: str, port: int, bound_s: float, mb: float, give_up_s: float) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

    started = time.monotonic()
    deadline = started + bound_s
    store = TCPStore(addr, port, len(nodes), True, timedelta(seconds=bound_s), wait_for_workers=False)
    join_by = started + bound_s / 2
    joined: dict[int, float] = {0: 0.0}
    while len(joined) < len(nodes) and time.monotonic() < join_by:
        for r in range(1, len(nodes)):
            if r not in joined and store.check([f"joined/{r}"]):
                joined[r] = time.monotonic() - started
        time.sleep(POLL_S)
    for r, node in enumerate(nodes):
        if r in joined:
            say("joined", node=node, s=f"{joined[r]:.3f}")
        else:
            say("missing", node=node, waited_s=f"{join_by - started:.3f}")
    if len(joined) < len(nodes):
        store.set("verdict", "abort")
        say("done", s=f"{time.monotonic() - started:.3f}")
        return
    store.set("verdict", "go")
    dist.init_process_group("gloo", store=PrefixStore("pg", store), rank=0, world_size=len(nodes))
    t = time.monotonic()
    dist.all_reduce(torch.ones(1))
    say("allreduce", s=f"{time.monotonic() - t:.3f}")
    buf = torch.zeros(max(1, int(mb * 1e6) // 4), dtype=torch.float32)
    acks = {r: torch.zeros(1) for r in range(1, len(nodes))}
    t = time.monotonic()
    sends = [dist.isend(buf, r) for r in acks]
    done = _wait_all({r: dist.irecv(a, r) for r, a in acks.items()}, min(deadline, t + give_up_s), t)
    for r in acks:
        if r in done:
            say("transfer", node=nodes[r], mb=f"{buf.numel() * 4 / 1e6:.3f}", s=f"{done[r]:.3f}")
        else:
            say("slow", node=nodes[r], after_s=f"{time.monotonic() - t:.3f}")
    del sends
    say("done", s=f"{time.monotonic() - started:.3f}")


def peer(rank: int, nodes: list[str], addr: str, port: int, bound_s: float, mb: float, give_up_s: float) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

    started = time.monotonic()
    deadline = started + bound_s
    store = TCPStore(addr, port, len(nodes), False, timedelta(seconds=bound_s))
    store.set(f"joined/{rank}", "1")
    store.wait(["verdict"], timedelta(seconds=max(0.1, deadline - time.monotonic())))
    if store.get("verdict") != b"go":
        return
    dist.init_process_group("gloo", store=PrefixStore("pg", store), rank=rank, world_size=len(nodes))
    dist.all_reduce(torch.ones(1))
    buf = torch.zeros(max(1, int(mb * 1e6) // 4), dtype=torch.float32)
    # The hub stops waiting give_up_s into the transfer; so does this side (a second later), or srun would wait
    # for the slow node's task until the bound.
    if _wait_all({0: dist.irecv(buf, 0)}, min(deadline, time.monotonic() + give_up_s + 1.0), started):
        dist.send(torch.ones(1), 0)


def main(env: Mapping[str, str]) -> int:
    nodes = [n for n in env.get("HPR_PREFLIGHT_NODES", "").split(",") if n]
    me = env.get("SLURMD_NODENAME", "")
    if me not in nodes:
        say("error", node=me or "?", why="not_in_node_set")
        return 2
    rank = nodes.index(me)
    addr, port = env.get("HPR_PREFLIGHT_ADDR", ""), int(env.get("HPR_PREFLIGHT_PORT", "0"))
    bound_s, mb = float(env.get("HPR_PREFLIGHT_BOUND_S", "20")), float(env.get("HPR_PREFLIGHT_MB", "4"))
    give_up_s = min(bound_s, float(env.get("HPR_PREFLIGHT_GIVE_UP_S", "0")) or bound_s)
    try:
        if rank == 0:
            hub(nodes, addr, port, bound_s, mb, give_up_s)
        else:
            peer(rank, nodes, addr, port, bound_s, mb, give_up_s)
    except Exception as err:  # noqa: BLE001 - any failure is this node's evidence; the hub's lines are the verdict's input
        say("error", node=me, why=type(err).__name__, detail=str(err).replace(" ", "_")[:200])
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(os.environ))
