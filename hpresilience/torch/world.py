"""The world file: how `srun --auto-resume-mode=inprocess` tells running ranks that the job's world changed.

In the in-process mode every node runs a step of its own (docs/slurm-notes.md says why), so a lost node ends
only its own step and the ranks on the other nodes keep running. When the wrapper has a replacement, it writes
the new world here (a JSON object, replaced atomically) and then launches the replacement's step; survivors
read it when a collective fails or at their next step (hpresilience/torch/inprocess.py) and build a new process
group from it. Torch-free: the wrapper writes it with the same code the ranks read it with.

The environment contract of each rank (beside the relaunch path's NODE_LIST, MASTER_ADDR, ...):

- HPR_WORLD_FILE: the world file's path (in the wrapper's state directory, which is on a shared file system).
- HPR_RANK_BASE: the first global rank of this node's step; a task's rank is HPR_RANK_BASE + SLURM_LOCALID.
- HPR_GENERATION: the world's generation this step was launched into (1 at the start; a replacement's is the
  generation that brought it in: its ranks take their state from a peer).
- HPR_STANDBY_NODE: set instead of HPR_RANK_BASE on a warm standby's step (a hot spare's, launched ahead of any
  fault: autoresume/launch/standby.py). Its rank is not known at start: it is the node's slot in the first world
  newer than HPR_GENERATION that names this node (Placement.assigned), and the rank variables are set then
  (assignment_env).

The file is written by the job's own wrapper, as the job's user, in a directory only that user can write: the
ranks trust it as they trust their own environment, and still refuse a malformed one (WorldFileError).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpresilience.errors import HPResilienceError
from hpresilience.fileio import atomic_write_text

WORLD_FILE_VAR = "HPR_WORLD_FILE"
RANK_BASE_VAR = "HPR_RANK_BASE"
GENERATION_VAR = "HPR_GENERATION"
STANDBY_NODE_VAR = "HPR_STANDBY_NODE"
# A rank that cannot finish an in-process recovery exits with this: the wrapper then falls back to a relaunch.
EXIT_INPROCESS_GAVE_UP = 86
MAX_WORLD_BYTES = 1 << 20


class WorldFileError(HPResilienceError):
    """The world file is not one the wrapper wrote (malformed, or fields out of range)."""


@dataclass(frozen=True)
class World:
    generation: int
    nodes: tuple[str, ...]
    master_addr: str
    master_port: int
    tasks_per_node: int
    new_ranks: tuple[int, ...] = ()  # ranks that start with no state: they receive it from a peer

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.tasks_per_node

    def to_json(self) -> str:
        return json.dumps(
            {
                "generation": self.generation,
                "nodes": list(self.nodes),
                "master_addr": self.master_addr,
                "master_port": self.master_port,
                "tasks_per_node": self.tasks_per_node,
                "world_size": self.world_size,
                "new_ranks": list(self.new_ranks),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> World:
        raw = json_object(text, "world file")
        nodes = raw.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) and n for n in nodes):
            raise WorldFileError("world file: nodes must be a non-empty list of node names")
        world = cls(
            generation=_int(raw, "generation", 1),
            nodes=tuple(nodes),
            master_addr=_text(raw, "master_addr"),
            master_port=_int(raw, "master_port", 1, 65535),
            tasks_per_node=_int(raw, "tasks_per_node", 1),
            new_ranks=tuple(_ranks(raw.get("new_ranks", []))),
        )
        if "world_size" in raw and raw["world_size"] != world.world_size:
            raise WorldFileError(f"world file: world_size {raw['world_size']!r} is not nodes x tasks_per_node")
        if any(r >= world.world_size for r in world.new_ranks):
            raise WorldFileError("world file: a new rank is outside the world")
        return world


def json_object(text: str, what: str) -> dict[str, Any]:
    """`text` as a JSON object, or WorldFileError naming `what` (the world file, the formed-world report)."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise WorldFileError(f"{what} is not JSON: {err}") from None
    if not isinstance(raw, dict):
        raise WorldFileError(f"{what} is not a JSON object")
    return raw


def _int(raw: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise WorldFileError(f"world file: {key} must be a whole number >= {low}, not {value!r}")
    return value


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value or len(value) > 255:
        raise WorldFileError(f"world file: {key} must be a non-empty string")
    return value


def _ranks(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in value):
        raise WorldFileError("world file: new_ranks must be a list of ranks")
    return sorted(set(value))


def write_world(path: Path | str, world: World) -> None:
    """Atomically (a reader sees the old world or the new one, never half of it); 0600: the job's user only."""
    atomic_write_text(path, world.to_json() + "\n", mode=0o600)


def read_world(path: Path | str) -> World | None:
    """The world in the file, or None while there is none yet."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_WORLD_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(raw) > MAX_WORLD_BYTES:
        raise WorldFileError(f"world file {path} is larger than {MAX_WORLD_BYTES} bytes")
    return World.from_json(raw.decode("utf-8", errors="replace"))


@dataclass(frozen=True)
class Placement:
    """Where this process sits, from its environment (the contract above)."""

    world_file: str  # "": not in the in-process mode; the one world is `fixed`
    rank_base: int
    local_rank: int
    generation: int
    fixed: World | None = None
    standby_node: str = ""  # a warm standby waiting for its node to be named in a world; "": placed

    @property
    def rank(self) -> int:
        return self.rank_base + self.local_rank

    def assignment(self, world: World | None) -> bool:
        """Whether `world` assigns this standby: newer than the world it was started beside, and naming its node
        (the node was a spare then, so the first world that names it gives it a slot)."""
        return world is not None and world.generation > self.generation and self.standby_node in world.nodes

    def assigned(self, world: World) -> Placement:
        """The standby's placement in `world`: its node's slot's ranks, born into that generation (a new rank)."""
        slot = world.nodes.index(self.standby_node)
        return Placement(self.world_file, slot * world.tasks_per_node, self.local_rank, world.generation)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Placement:
        """The in-process mode's placement; without HPR_WORLD_FILE (the relaunch path, which the in-process
        mode falls back to), the step's one world from the relaunch path's variables (NODE_LIST, MASTER_ADDR,
        MASTER_PORT, NTASKS_PER_NODE; the rank is SLURM_PROCID, node-major as that path lays tasks out)."""
        env = os.environ if env is None else env
        path = env.get(WORLD_FILE_VAR, "")
        standby = env.get(STANDBY_NODE_VAR, "") if path else ""
        try:
            if not path:
                return cls._relaunched(env)
            base = 0 if standby else int(env.get(RANK_BASE_VAR, "0"))
            local = int(env.get("SLURM_LOCALID", env.get("LOCAL_RANK", "0")))
            generation = int(env.get(GENERATION_VAR, "1"))
        except (KeyError, ValueError) as err:
            raise WorldFileError(f"placement variables missing or not whole numbers: {err}") from None
        if base < 0 or local < 0 or generation < 1:
            raise WorldFileError("in-process placement variables out of range")
        return cls(path, base, local, generation, standby_node=standby)

    @classmethod
    def _relaunched(cls, env: Mapping[str, str]) -> Placement:
        if "NODE_LIST" not in env:
            raise WorldFileError(f"{WORLD_FILE_VAR} is not set: run under srun --auto-resume=1")
        nodes = tuple(n for n in env["NODE_LIST"].split(",") if n)
        raw = {
            "generation": 1,
            "nodes": list(nodes),
            "master_addr": env["MASTER_ADDR"],
            "master_port": int(env["MASTER_PORT"]),
            "tasks_per_node": int(env.get("NTASKS_PER_NODE", "1")),
        }
        world = World.from_json(json.dumps(raw))
        rank = int(env.get("SLURM_PROCID", env.get("RANK", "0")))
        if not 0 <= rank < world.world_size:
            raise WorldFileError(f"rank {rank} is outside the step's world of {world.world_size}")
        return cls("", rank, 0, 1, world)


def assignment_env(placement: Placement, world: World) -> dict[str, str]:
    """The variables a rank of `world` at `placement` has (what pernode.py and the wrapper's launch give a rank
    launched into it), for a standby to take on at assignment: code that reads them after the loop's start, and
    the processes it starts, see a rank like any other."""
    return {
        RANK_BASE_VAR: str(placement.rank_base),
        GENERATION_VAR: str(world.generation),
        "RANK": str(placement.rank),
        "LOCAL_RANK": str(placement.local_rank),
        "WORLD_SIZE": str(world.world_size),
        "NODE_LIST": ",".join(world.nodes),
        "NNODES": str(len(world.nodes)),
        "MASTER_ADDR": world.master_addr,
        "MASTER_PORT": str(world.master_port),
    }
