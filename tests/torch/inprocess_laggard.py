#!/usr/bin/env python3
"""A rank one step behind and a new rank, made on purpose (tests/torch/test_inprocess.py).

Three ranks train 5 steps together. Then rank 1 puts back its state of step 4 (as if its step-5 all-reduce had
failed after the others' completed), rank 2 starts over with other weights and no optimizer state (a new rank),
rank 0 writes the next world, and all three join it and train on.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import torch

from hpresilience.torch.agreement import NEW
from hpresilience.torch.inprocess import InProcessLoop
from hpresilience.torch.world import read_world, write_world

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "checkpointless"))
train: Any = importlib.import_module("train")  # the example's model, data and digest


def main() -> None:
    steps = int(os.environ["TRAIN_STEPS"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loop = InProcessLoop(model, optimizer)
    saved: dict[str, object] = {}

    def compute(step: int) -> None:
        x, y = train.batch(loop.rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]

    def keep(done: int) -> None:
        if done == 4:
            saved["model"] = copy.deepcopy(model.state_dict())
            saved["optimizer"] = copy.deepcopy(optimizer.state_dict())

    loop.run(compute, 5, keep)
    if loop.rank == 1:
        model.load_state_dict(saved["model"])  # type: ignore[arg-type]
        optimizer.load_state_dict(saved["optimizer"])  # type: ignore[arg-type]
        loop.completed = 4
    elif loop.rank == 2:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        optimizer.state.clear()
        loop.completed, loop.last_grads = NEW, None
    else:
        world = read_world(loop.placement.world_file)
        assert world is not None
        write_world(
            loop.placement.world_file,
            type(world)(world.generation + 1, world.nodes, world.master_addr, world.master_port + 1, 1, (2,)),
        )
    loop.close()
    loop._recover("test")
    done = loop.run(compute, steps)
    print(f"final rank={loop.rank} step={done} sha256={train.weights_digest(model)}", flush=True)
    loop.close()


if __name__ == "__main__":
    main()
