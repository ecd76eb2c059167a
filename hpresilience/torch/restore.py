"""Choosing the step to restore: pure logic over what each rank reported, identical on every rank."""

from __future__ import annotations

from typing import Any

# ("own", rank) | ("peer", holder rank) | ("s3", -1)
Source = tuple[str, int]


def choose_step(
    invs: list[dict[str, Any]],
    s3_steps: set[int],
    bad: set[tuple[int, Source, int]],
    world: int,
    wanted: int | None = None,
) -> tuple[int, list[Source]] | None:
    """The newest committed step for which every rank has a usable source, and those sources.

    A step is committed when any rank saw its COMMIT marker (own tier or a peer copy) or S3 has its
    marker. Sources are tried nearest first: own memory, the peer copy, S3. `bad` lists sources that
    already failed verification.
    """
    committed: set[int] = set(s3_steps)
    for inv in invs:
        committed |= set(inv["committed"])
    candidates = [wanted] if wanted is not None else sorted(committed, reverse=True)
    for step in candidates:
        if step not in committed:
            continue
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
