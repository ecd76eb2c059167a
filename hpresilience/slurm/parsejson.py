"""Pure parsers of Slurm's JSON output. No I/O: text in, models out (the text forms are parse.py's).

Two JSON dialects reach us:
- v0.0.38 (Slurm 22.05, Debian 12): `sinfo --json` / `squeue --json`; node `state` is a lower-case
  base state string plus a separate `state_flags` list; numbers are plain ints or null.
- v0.0.40+ (Slurm 23.11 and newer): `scontrol --json show node|job`; `state` / `job_state` are
  lists of upper-case words; many numbers are `{"set": bool, "infinite": bool, "number": int}`;
  `features` and `partitions` may be lists (csv_string).
Both are normalised to the same Node and Job models.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

from hpresilience.errors import SlurmParseError
from hpresilience.log import get_logger
from hpresilience.slurm.hostlist import expand
from hpresilience.slurm.models import Job, Node
from hpresilience.slurm.parse import words

T = TypeVar("T")
log = get_logger("hpresilience.slurm")


def _loads(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except RecursionError:
        raise SlurmParseError([what], None, "", f"{what}: output is JSON nested too deeply to read") from None
    except ValueError as err:  # also a number of more than 4300 digits
        snippet = text.strip()[:80]
        raise SlurmParseError([what], None, "", f"{what}: output is not JSON ({err}): {snippet!r}") from None
    if not isinstance(data, dict):
        raise SlurmParseError([what], None, "", f"{what}: expected a JSON object, got {type(data).__name__}")
    errors = data.get("errors") or []
    if not isinstance(errors, list):
        errors = [errors]
    if errors and not any(k in data for k in ("nodes", "jobs")):
        first = errors[0]
        msg = (first.get("error") or first.get("description")) if isinstance(first, dict) else first
        msg = str(msg)[:300]
        raise SlurmParseError([what], None, str(msg), f"{what}: Slurm reported an error: {msg}")
    return data


def number(value: Any) -> int | None:
    """A Slurm number in either dialect: int, null, or the v0.0.40+ `{set, infinite, number}` struct."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None  # NaN/Infinity: JSON Slurm never writes
    if isinstance(value, dict):
        if value.get("infinite") or not value.get("set", True):
            return None
        n = value.get("number")
        return number(n) if isinstance(n, (int, float)) and not isinstance(n, bool) else None
    # ASCII only and bounded: "²".isdigit() is true but int() refuses it, and int() of 4300+ digits raises.
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return None


def _states(raw_state: Any, flags: Any) -> frozenset[str]:
    found: list[str] = []
    if isinstance(raw_state, str):
        # v0.0.38 base states are lower case ("allocated"); 23.02 uses "ALLOCATED" too.
        found += [w for w in re.split(r"[+,\s]+", raw_state.upper()) if w]
    elif isinstance(raw_state, list):
        found += [str(w).upper() for w in raw_state]
    if isinstance(flags, list):
        found += [str(w).upper() for w in flags]
    # 22.05 spells the DRAINING/DRAINED pair as the single DRAIN flag; newer releases agree.
    return frozenset(found) or frozenset({"UNKNOWN"})


def node_from_dict(d: dict[str, Any]) -> Node:
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise SlurmParseError(["node"], None, "", f"node record without a name: keys {sorted(d)[:8]}")
    return Node(
        name=name,
        address=str(d.get("address") or name),
        hostname=str(d.get("hostname") or name),
        states=_states(d.get("state"), d.get("state_flags")),
        reason=str(d.get("reason") or ""),
        # 22.05's JSON names a user also for nodes without a reason; the text form does not: no reason, no user.
        reason_set_by=str(d.get("reason_set_by_user") or "") if d.get("reason") else "",
        reason_changed_at=number(d.get("reason_changed_at")) or None,
        features=words(d.get("features")),
        gres=str(d.get("gres") or ""),
        partitions=words(d.get("partitions")),
        cpus=number(d.get("cpus")) or 0,
        slurmd_start_time=number(d.get("slurmd_start_time")) or None,
        boot_time=number(d.get("boot_time")) or None,
    )


def _records(text: str, what: str, key: str, build: Callable[[dict[str, Any]], T]) -> list[T]:
    """The list under `key`, built record by record: one odd record is skipped and logged, not fatal."""
    data = _loads(text, what)
    raw = data.get(key)
    if not isinstance(raw, list):
        if key == "nodes" and isinstance(data.get("sinfo"), list):
            # 23.02+ `sinfo --json` lists aggregated node groups (states, counts, names; no addresses).
            raise SlurmParseError(
                [what],
                None,
                "",
                f"{what}: node groups of sinfo --json (Slurm 23.02+), not "
                "node records: read nodes with `scontrol --json show node`",
            )
        raise SlurmParseError([what], None, "", f"{what}: no `{key}` list in the output")
    out = []
    for d in raw:
        try:
            if not isinstance(d, dict):
                raise SlurmParseError([what], None, "", f"{key} entry is a {type(d).__name__}, not an object")
            out.append(build(d))
        # A record Slurm (or a broken plugin) wrote oddly costs that record, never the whole query: the
        # wrapper, which only catches the package's own errors, must not die of one node's odd field.
        except (SlurmParseError, TypeError, ValueError, OverflowError, KeyError, AttributeError, RecursionError) as err:
            log.warning("slurm_record_skipped", source=what, error=str(err)[:300])
    return out


def parse_nodes_json(text: str, what: str = "nodes") -> list[Node]:
    """Nodes from `sinfo --json` (v0.0.38) or `scontrol --json show node` (v0.0.40+)."""
    return _records(text, what, "nodes", node_from_dict)


def _job_state(value: Any) -> tuple[str, tuple[str, ...]]:
    if isinstance(value, str):
        return value.upper(), ()
    if isinstance(value, list) and value:
        words = [str(w).upper() for w in value]
        return words[0], tuple(words[1:])
    return "UNKNOWN", ()


def job_from_dict(d: dict[str, Any]) -> Job:
    job_id = number(d.get("job_id"))
    if job_id is None:
        raise SlurmParseError(["job"], None, "", f"job record without a job_id: keys {sorted(d)[:8]}")
    state, state_flags = _job_state(d.get("job_state"))
    nodes = tuple(expand(str(d.get("nodes") or "")))  # a malformed hostlist skips this job, see _records
    return Job(
        job_id=job_id,
        name=str(d.get("name") or ""),
        state=state,
        nodes=nodes,
        num_nodes=len(nodes) if nodes else (number(d.get("node_count")) or 0),
        user=str(d.get("user_name") or ""),
        partition=str(d.get("partition") or ""),
        batch_host=str(d.get("batch_host") or ""),
        restart_count=number(d.get("restart_cnt")) or 0,
        state_reason=str(d.get("state_reason") or ""),
        dependency=str(d.get("dependency") or ""),
        excluded_nodes=tuple(expand(str(d.get("excluded_nodes") or ""))),
        flags=words(d.get("flags")) + state_flags,
    )


def parse_jobs_json(text: str, what: str = "jobs") -> list[Job]:
    """Jobs from `squeue --json` (v0.0.38) or `scontrol --json show job` (v0.0.40+)."""
    return _records(text, what, "jobs", job_from_dict)
