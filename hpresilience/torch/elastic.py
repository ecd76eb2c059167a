"""Restoring a step saved with another world size: every loading rank gathers the saved shards it needs.

A job that shrank or grew (elastic training, a replaced node that came back) loads a step whose shards
are numbered by the old ranks. DCP reshards from any set of shard files, so the only work is to bring
each saved shard to the ranks that need it: from a node's memory tier over the checkpoint's gloo group
(one transfer at a time, in the same order on every rank), else from the durable tier. Fetched shards
live under `<namespace>/.restore/rank_<loading rank>/`, one folder per loading rank: the ranks of one node
share the memory tier and must never create or remove each other's folders (issue 22). They are removed
once the load is done.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any, Protocol

from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.stateful import Stateful

from hpresilience.errors import HPResilienceError
from hpresilience.torch.durable import DurableTier
from hpresilience.torch.layout import METADATA, MemoryTier, ShardIndex, shard_names, step_name, verify_shard
from hpresilience.torch.private import read_trusted
from hpresilience.torch.replica import recv_files, send_files
from hpresilience.torch.restore import Source


class LoadingRank(Protocol):
    """What gathering needs of the loading rank (loading.Loader is one)."""

    tier: MemoryTier
    durable: DurableTier | None
    rank: int
    repl_pg: Any  # the gloo group shard transfers use

    def gather(self, obj: Any) -> list[Any]: ...


def restore_dir(ck: LoadingRank, step: int) -> Path:
    return ck.tier.base / ".restore" / f"rank_{ck.rank}" / step_name(step)


def needed_ranks(state_dict: dict[str, Any] | None, metadata_path: Path, saved: int) -> set[int]:
    """The saved ranks whose shards hold something `state_dict` asks for (DCP's own load planning);
    all of them when that cannot be worked out (no state dict given, unreadable metadata)."""
    everything = set(range(saved))
    if state_dict is None:
        return everything
    try:
        md = pickle.loads(read_trusted(metadata_path))
        plain = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}
        planner = DefaultLoadPlanner()
        planner.set_up_planner(plain, md, is_coordinator=False)
        plan = planner.create_local_plan()
        locs = md.storage_data or {}
        need = {int(locs[item.storage_index].rank) for item in plan.items if item.storage_index in locs}
    except Exception:  # noqa: BLE001 - planning problems surface in dcp.load itself; gather everything
        return everything
    return need & everything


def gather_shards(
    ck: LoadingRank,
    step: int,
    saved: int,
    sources: list[Source],
    s3_steps: set[int],
    state_dict: dict[str, Any] | None = None,
    verify_first: bool = False,
) -> tuple[str | None, list[Path]]:
    """Bring the saved shards of `step` this rank needs within reach; (problem or None, folders to search).

    Checksums are verified as DCP reads the items this rank needs (a damaged shard fails the load, and
    the step is skipped); `verify_first` verifies every gathered shard whole beforehand instead, for
    callers that cannot retry a failed dcp.load.

    What a rank needs comes from DCP's load planning over `state_dict` (each new rank reads the parts its
    layout covers); without a state dict, every saved shard.
    """
    into = restore_dir(ck, step)
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    need = needed_ranks(state_dict, ck.tier.step_dir(step) / METADATA, saved)
    have = {r: ck.tier.find_shard(step, r) for r in sorted(need)}
    missing = [r for r, d in have.items() if d is None]
    wants = ck.gather(missing)
    problem: str | None = None
    # The same loop on every rank: each (needer, saved rank) pair that a node serves is one transfer.
    for needer, rs in enumerate(wants):
        for r in rs:
            src = sources[r]
            if src[0] != "node" or src[1] == needer:
                continue
            holder = src[1]
            files = shard_names(r)
            if ck.rank == holder:
                d = ck.tier.find_shard(step, r)
                assert d is not None, f"rank {holder} reported shard {r} of step {step} and lost it"
                send_files(ck.repl_pg, [d / n for n in files], dst=needer)
            elif ck.rank == needer:
                recv_files(ck.repl_pg, [into / n for n in files], src=holder)
    dirs: list[Path] = []
    for r in missing:
        try:
            if not all((into / n).is_file() for n in shard_names(r)):
                if ck.durable is None or step not in s3_steps:
                    raise HPResilienceError(f"saved rank {r}'s shard of step {step} is on no node and not in S3")
                ck.durable.download_shard(step, r, into)
        except (HPResilienceError, OSError) as err:
            problem = problem or str(err)
    for d in have.values():
        if d is not None and d not in dirs:
            dirs.append(d)
    dirs.append(into)
    if problem is None:
        problem = _verify_all(step, sorted(need), dirs, whole=verify_first)
    return problem, dirs


def _verify_all(step: int, ranks: list[int], dirs: list[Path], *, whole: bool) -> str | None:
    for r in ranks:
        d = next((x for x in dirs if all((x / n).is_file() for n in shard_names(r))), None)
        if d is None:
            return f"saved rank {r}'s shard of step {step} did not arrive"
        data, idx = (d / n for n in shard_names(r))
        try:
            index = ShardIndex.from_json(read_trusted(idx), str(idx))
            if whole:
                verify_shard(data, index)
            elif data.stat().st_size != index.size:
                return f"{data}: {data.stat().st_size} bytes, index says {index.size}"
        except (HPResilienceError, OSError) as err:
            return str(err)
    return None


def cleanup(ck: LoadingRank, step: int) -> None:
    shutil.rmtree(restore_dir(ck, step).parent, ignore_errors=True)


def describe(sources: list[Source]) -> dict[str, Any]:
    return {
        "from_nodes": sum(1 for s in sources if s[0] == "node"),
        "from_s3": sum(1 for s in sources if s[0] == "s3"),
    }
