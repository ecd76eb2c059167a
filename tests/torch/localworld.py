"""A stand-in for the wrapper's in-process mode on localhost: ranks as subprocesses, the world file written here.

Each rank is its own process (HPR_RANK_BASE = its rank, SLURM_LOCALID 0), as a step per node would start it; a
"fault" is a rank that exits, after which the test writes the next world and starts the replacement, as
autoresume/inprocess.py does on a cluster.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hpresilience.torch.world import World, write_world
from tests.conftest import TEST_BASE_PORT, shared_result

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "checkpointless" / "train.py"
# Away from the devcluster's ports (base .. base+~200) and the other fixtures' (+600).
PORT_BASE = TEST_BASE_PORT + 900


class LocalWorld:
    def __init__(
        self, tmp: Path, size: int, env: dict[str, str], script: Path = TRAIN, nodes: tuple[str, ...] | None = None
    ) -> None:
        self.nodes = nodes or ("n",) * size
        self.tmp = tmp
        self.size = size
        self.env = env
        self.script = script
        self.world_file = tmp / "world.json"
        self.generation = 0
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.logs: dict[tuple[int, int], Path] = {}
        self.announce(())

    def announce(self, new_ranks: tuple[int, ...], nodes: tuple[str, ...] | None = None) -> World:
        """The next generation's world; `nodes`: its node names, one per rank (a standby's node among them
        assigns it), by default the first world's."""
        self.generation += 1
        # One port per generation: a new TCPStore, never one in TIME_WAIT.
        names = nodes or self.nodes
        world = World(self.generation, names, "127.0.0.1", PORT_BASE + self.generation, 1, new_ranks)
        write_world(self.world_file, world)
        return world

    def start_standby(self, node: str, rank_slot: int) -> subprocess.Popen[bytes]:
        """A warm standby on `node`, as launch/standby.py starts one: no rank yet, waits to be named in a world
        newer than the current one; its output is logged as the rank of `rank_slot` in the next generation."""
        env = {
            **os.environ,
            **self.env,
            "HPR_WORLD_FILE": str(self.world_file),
            "HPR_STANDBY_NODE": node,
            "SLURM_LOCALID": "0",
            "HPR_GENERATION": str(self.generation),
        }
        env.pop("HPR_RANK_BASE", None)
        log = self.tmp / f"standby-{node}.log"
        self.logs[(rank_slot, self.generation + 1)] = log
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(self.script)], env=env, stdout=out, stderr=subprocess.STDOUT)
        self.procs[rank_slot] = proc
        return proc

    def start(self, rank: int, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            **self.env,
            **(extra or {}),
            "HPR_WORLD_FILE": str(self.world_file),
            "HPR_RANK_BASE": str(rank),
            "SLURM_LOCALID": "0",
            "HPR_GENERATION": str(self.generation),
        }
        log = self.tmp / f"rank{rank}-g{self.generation}.log"
        self.logs[(rank, self.generation)] = log
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(self.script)], env=env, stdout=out, stderr=subprocess.STDOUT)
        self.procs[rank] = proc
        return proc

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs.values() if p.exists())

    def finish(self, timeout: float = 240.0) -> dict[int, int]:
        try:
            return {r: p.wait(timeout) for r, p in self.procs.items()}
        finally:
            for p in self.procs.values():
                if p.poll() is None:
                    p.kill()


def digests(text: str) -> dict[int, str]:
    """rank -> the sha256 of its final weights, from the `final rank=R step=N sha256=H` lines."""
    return {int(r): h for r, h in re.findall(r"^final rank=(\d+) step=\d+ sha256=(\w+)$", text, re.MULTILINE)}


def joined(text: str) -> list[dict[str, str]]:
    """Every `hpr-inprocess joined k=v ...` line, as a dict."""
    return [
        dict(kv.split("=", 1) for kv in line.split()[2:])
        for line in text.splitlines()
        if line.startswith("hpr-inprocess joined ")
    ]


def fault_free_digest(tmp: Path, size: int, steps: int, timeout: float = 240.0) -> str:
    """The final weights' digest of the same job run with no fault (every rank must agree; each rank ends within
    `timeout`). The run is deterministic, so a run of the suite computes each (size, steps) once: every rank starts
    torch, and the in-process files, on several workers, ask for the same few references in most tests."""
    return shared_result(f"fault-free-{size}-{steps}", lambda: _run_fault_free(tmp, size, steps, timeout))


def _run_fault_free(tmp: Path, size: int, steps: int, timeout: float) -> str:
    tmp.mkdir(parents=True, exist_ok=True)
    world = LocalWorld(tmp, size, {"TRAIN_STEPS": str(steps), "STEP_SLEEP": "0"})
    for rank in range(size):
        world.start(rank)
    assert set(world.finish(timeout).values()) == {0}, world.output()
    found = set(digests(world.output()).values())
    assert len(found) == 1, world.output()
    return found.pop()
