"""Writes the flight-recorder fixtures beside this file with torch's own writer (CPU build, gloo).

Three ranks of one gloo group with TORCH_FR_BUFFER_SIZE set; ranks 0 and 1 enter a third all_reduce that rank 2
has not reached (it lags, as a hung rank would), every rank dumps its records
(`torch._C._distributed_c10d._dump_fr_trace`, the pickle that TORCH_FR_DUMP_TEMP_FILE dumps hold), then rank 2
catches up so the run ends cleanly. Run: `.venv/bin/python tests/autoresume/data/fr/make_fixtures.py PORT`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).parent


def rank_main(rank: int, port: int) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "100"
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]  # private, not in the stubs

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t)
    pending = dist.all_reduce(t, async_op=True) if rank < 2 else None
    dist.barrier(group=dist.new_group([0, 1], use_local_synchronization=True)) if rank < 2 else None
    store = dist.distributed_c10d._get_default_store()
    store.add("entered", 1)
    while int(store.add("entered", 0)) < 3:
        pass
    (HERE / f"gloo-lagging-rank{rank}.pkl").write_bytes(
        _dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    )
    store.add("dumped", 1)
    while int(store.add("dumped", 0)) < 3:
        pass
    if pending is None:
        dist.all_reduce(t)
    else:
        pending.wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) == 3:
        rank_main(int(sys.argv[2]), int(sys.argv[1]))
    else:
        import subprocess

        procs = [subprocess.Popen([sys.executable, __file__, sys.argv[1], str(r)]) for r in range(3)]
        sys.exit(max(p.wait(timeout=120) for p in procs))
