"""Choosing the step to restore: pure logic over what each rank reported, identical on every rank."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

# ("own", rank) | ("peer", holder rank) | ("s3", -1)
Source = tuple[str, int]


def _candidates(
    invs: list[dict[str, Any]], s3_steps: set[int], wanted: int | None, exclude: Collection[int]
) -> list[int]:
    """Committed steps (a COMMIT marker seen by any rank, or S3's marker), newest first, or just `wanted`
    when it is committed; `exclude` left out."""
    committed: set[int] = set(s3_steps)
    for inv in invs:
        committed |= set(inv["committed"])
    steps = [wanted] if wanted is not None else sorted(committed, reverse=True)
    return [s for s in steps if s in committed and s not in exclude]


def choose_step(
    invs: list[dict[str, Any]],
    s3_steps: set[int],
    bad: set[tuple[int, Source, int]],
    world: int,
    wanted: int | None = None,
    skip: set[int] | frozenset[int] = frozenset(),
) -> tuple[int, list[Source]] | None:
    """The newest committed step for which every rank has a usable source, and those sources.

    `skip`: steps saved with another world size (choose_elastic plans those).

    A step is committed when any rank saw its COMMIT marker (own tier or a peer copy) or S3 has its
    marker. Sources are tried nearest first: own memory, the peer copy, S3. `bad` lists sources that
    already failed verification.
    """
    for step in _candidates(invs, s3_steps, wanted, skip):
        sources: list[Source] = []
        for r in range(world):
            src = _source_for(r, step, invs, s3_steps, bad)
            if src is None:
                break
            sources.append(src)
        else:
            return step, sources
    return None


def _source_for(
    r: int, step: int, invs: list[dict[str, Any]], s3_steps: set[int], bad: set[tuple[int, Source, int]]
) -> Source | None:
    options: list[Source] = []
    if r < len(invs) and step in invs[r]["own"]:
        options.append(("own", r))
    options += [("peer", p) for p, inv in enumerate(invs) if p != r and step in inv["held"].get(r, [])]
    if step in s3_steps:
        options.append(("s3", -1))
    for opt in options:
        if (r, opt, step) not in bad:
            return opt
    return None


def saved_world(step: int, invs: list[dict[str, Any]], s3_worlds: dict[int, int], world: int) -> int:
    """The world size `step` was saved with, from any rank's COMMIT marker or S3's; else assume ours."""
    for inv in invs:
        ws = inv.get("worlds", {}).get(step)
        if ws is not None:
            return int(ws)
    return int(s3_worlds.get(step, world))


def choose_elastic(
    invs: list[dict[str, Any]],
    s3_steps: set[int],
    s3_worlds: dict[int, int],
    bad_steps: set[int],
    world: int,
    wanted: int | None = None,
) -> tuple[int, int, list[Source]] | None:
    """The newest committed step saved with a world size other than ours whose every saved shard is
    somewhere (a node's memory tier or S3): (step, saved world size, source of each saved rank's shard).

    Only steps whose saved world size is known are considered (a COMMIT marker records it).
    """
    for step in _candidates(invs, s3_steps, wanted, bad_steps):
        ws = saved_world(step, invs, s3_worlds, world)
        if ws == world:
            continue
        sources: list[Source] = []
        for r in range(ws):
            holders = [p for p, inv in enumerate(invs) if r in inv.get("shards", {}).get(step, [])]
            if holders:
                sources.append(("node", holders[0]))
            elif step in s3_steps:
                sources.append(("s3", -1))
            else:
                break
        else:
            return step, ws, sources
    return None
