"""The formed-world report: how the ranks tell the in-process wrapper that a recovery finished, and what it cost.

The wrapper writes a world (world.py) and cannot see, from outside, when the ranks have built the new process
group, agreed on the step, passed state on and trained a step in it: a second fault before then, or no such news
within a bound, means the in-process recovery cannot finish and the job falls back to the relaunch path
(autoresume/inprocessguard.py). So rank 0 of each world, once the first step in it has completed (every rank
took part in that step's all-reduce: the world is whole), writes one small file beside the world file, replaced
atomically: O(1) per recovery whatever the job's size (one writer, one file).

Its times are rank 0's wall clock (epoch seconds) at each part's end, which the ledger turns into the in-process
recovery's parts (goodput/inprocessparts.py): fault seen -> old group torn down -> new group built -> step agreed
and state passed on -> first step after. Torch-free: the wrapper reads it with the same code the ranks write it
with; like the world file it is the job's user's own file, read by the job's own wrapper, and still refused when
malformed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpresilience.fileio import atomic_write_text
from hpresilience.torch.world import WorldFileError, json_object

SUFFIX = ".formed"
MAX_REPORT_BYTES = 64 * 1024
TIMES = ("started_at", "torn_down_at", "joined_at", "agreed_at", "first_step_at")


@dataclass(frozen=True)
class Formed:
    generation: int
    step: int  # the completed steps the world agreed on (its first step after was step + 1)
    cause: str  # what rank 0 saw: start, new_world, collective_failed
    started_at: float  # rank 0 saw the fault (or, for generation 1, started)
    torn_down_at: float  # its old process group was gone
    joined_at: float  # the new process group was built
    agreed_at: float  # the step agreed on and the state passed on (new ranks, ranks one step behind)
    first_step_at: float  # the first step in the new world completed
    state_to: int = 0  # ranks that received model and optimizer state from a peer
    grads_to: int = 0  # ranks one step behind that applied a peer's averaged gradients

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Formed:
        raw = json_object(text, "formed-world report")
        cause = raw.get("cause")
        if not isinstance(cause, str) or len(cause) > 64:
            raise WorldFileError("formed-world report: cause must be a short string")
        times = {key: _time(raw, key) for key in TIMES}
        if sorted(times.values()) != [times[k] for k in TIMES]:
            raise WorldFileError("formed-world report: its times are not in order")
        return cls(
            generation=_count(raw, "generation", 1),
            step=_count(raw, "step", 0),
            cause=cause,
            state_to=_count(raw, "state_to", 0),
            grads_to=_count(raw, "grads_to", 0),
            **times,
        )

    def parts(self) -> dict[str, float]:
        """The recovery's parts as rank 0 timed them (seconds)."""
        return {
            "teardown_s": self.torn_down_at - self.started_at,
            "new_world_s": self.joined_at - self.torn_down_at,
            "state_transfer_s": self.agreed_at - self.joined_at,
            "first_step_s": self.first_step_at - self.agreed_at,
        }


def _count(raw: Mapping[str, Any], key: str, low: int) -> int:
    v = raw.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v < 1 << 53:
        raise WorldFileError(f"formed-world report: {key} must be a whole number >= {low}")
    return v


def _time(raw: Mapping[str, Any], key: str) -> float:
    v = raw.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v < 1e11:
        raise WorldFileError(f"formed-world report: {key} must be a time (epoch seconds)")
    return float(v)


def report_path(world_file: Path | str) -> str:
    return f"{world_file}{SUFFIX}"


def write_formed(world_file: Path | str, formed: Formed) -> None:
    atomic_write_text(report_path(world_file), formed.to_json() + "\n", mode=0o600)


def read_formed(world_file: Path | str) -> Formed | None:
    """The last world the ranks reported formed, or None while none has."""
    try:
        with open(report_path(world_file), "rb") as f:
            raw = f.read(MAX_REPORT_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(raw) > MAX_REPORT_BYTES:
        raise WorldFileError(f"formed-world report {report_path(world_file)} is larger than {MAX_REPORT_BYTES} bytes")
    return Formed.from_json(raw.decode("utf-8", errors="replace"))
