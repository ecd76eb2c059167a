"""Pure parsers of Slurm command output. No I/O: text in, models out.

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
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hpresilience.errors import SlurmParseError
from hpresilience.log import get_logger
from hpresilience.slurm.hostlist import expand
from hpresilience.slurm.models import Job, Node, ReasonGroup

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


def _words(value: Any) -> tuple[str, ...]:
    """A comma string or a list of strings (csv_string) as a tuple of non-empty words."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(w for w in (p.strip() for p in value.split(",")) if w)
    if isinstance(value, list):
        return tuple(str(w) for w in value if str(w))
    return ()


def _states(raw_state: Any, flags: Any) -> frozenset[str]:
    words: list[str] = []
    if isinstance(raw_state, str):
        # v0.0.38 base states are lower case ("allocated"); 23.02 uses "ALLOCATED" too.
        words += [w for w in re.split(r"[+,\s]+", raw_state.upper()) if w]
    elif isinstance(raw_state, list):
        words += [str(w).upper() for w in raw_state]
    if isinstance(flags, list):
        words += [str(w).upper() for w in flags]
    # 22.05 spells the DRAINING/DRAINED pair as the single DRAIN flag; newer releases agree.
    return frozenset(words) or frozenset({"UNKNOWN"})


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
        features=_words(d.get("features")),
        gres=str(d.get("gres") or ""),
        partitions=_words(d.get("partitions")),
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
        flags=_words(d.get("flags")) + state_flags,
    )


def parse_jobs_json(text: str, what: str = "jobs") -> list[Job]:
    """Jobs from `squeue --json` (v0.0.38) or `scontrol --json show job` (v0.0.40+)."""
    return _records(text, what, "jobs", job_from_dict)


_VERSION = re.compile(r"([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,9})")


def parse_version(text: str) -> tuple[int, int, int]:
    """`slurm-wlm 22.05.8` or `slurm 24.05.1` -> (22, 5, 8)."""
    m = _VERSION.search(text)
    if not m:
        raise SlurmParseError(["--version"], None, "", f"cannot read a Slurm version from {text.strip()[:60]!r}")
    major, minor, micro = (int(g) for g in m.groups())
    return major, minor, micro


def parse_key_values(text: str) -> dict[str, str]:
    """`scontrol show config` style `Key = Value` lines into a dict (later keys win)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def option_value(options: str, key: str) -> str | None:
    """The value of `key=value` in a comma-separated option list (SchedulerParameters, SlurmctldParameters);
    '' for a bare flag, None when absent."""
    for item in options.split(","):
        name, sep, value = item.strip().partition("=")
        if name == key:
            return value if sep else ""
    return None


def parse_oneliner(text: str) -> dict[str, str]:
    """`scontrol show job -o` output: space-separated `Key=Value` pairs; values may not contain spaces
    except where Slurm leaves them unquoted, so we split on ` Key=` boundaries only."""
    out: dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*(?:\s(?![A-Za-z][\w/:]*=)\S+)*)", text.strip()):
        out.setdefault(m.group(1), m.group(2))
    return out


_JOB_ID = re.compile(
    r"(?:Submitted batch job|Granted job allocation|job allocation|Pending job allocation)\s+([0-9]{1,18})\b"
)


def parse_job_id(text: str) -> int:
    """The job id from sbatch/salloc chatter (`Submitted batch job 12`, `Granted job allocation 12`)."""
    m = _JOB_ID.search(text)
    if not m:
        stripped = text.strip()
        first = stripped.split(";")[0]
        if first.isascii() and first.isdigit() and len(first) <= 18:  # sbatch --parsable
            return int(first)
        raise SlurmParseError(["sbatch/salloc"], None, text, f"no job id in {stripped[:80]!r}")
    return int(m.group(1))


# -- `scontrol show node|job -o` (Slurm 22.05: its scontrol has no --json, and only scontrol filters) ------
_KEY = r"[A-Za-z][\w/:]*"
# A node's reason is free text ("Action:Replace xid=79", "bad fan [rack 3]") followed by `[user@time]`:
# it is cut out first, so words of it that look like `Key=Value` never become fields.
_NODE_REASON = re.compile(
    rf"(?:^|\s)Reason=(?P<text>.*?) \[(?P<user>[^\]@\s]*)@(?P<time>[^\]\s]*)\]"
    rf"(?=\s+{_KEY}=|\s*$)"
)
_NODE_REASON_BARE = re.compile(r"(?:^|\s)Reason=(?P<text>.*?)(?=\s+(?:Comment|Extra|ResumeAfterTime)=|\s*$)")
_NULLS = ("", "(null)", "N/A", "None", "Unknown", "n/a")


def _text(value: str | None) -> str:
    return "" if value is None or value in _NULLS else value


def slurm_time(value: str | None) -> int | None:
    """A time as scontrol prints it (`2026-11-25T02:17:51`, local time) as epoch seconds; None when unset."""
    text = _text(value)
    if not text:
        return None
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    m = re.match(r"\d+", value or "")
    return int(m.group(0)) if m else None


def _node_states(text: str) -> frozenset[str]:
    words: list[str] = []
    for w in (p for p in text.upper().split("+") if p):
        # Older releases mark a node that does not answer as `DOWN*`; the JSON has the NOT_RESPONDING flag.
        if w.endswith("*"):
            words.append("NOT_RESPONDING")
        words.append(w.rstrip("*~#%!@^-"))
    return frozenset(w for w in words if w) or frozenset({"UNKNOWN"})


def node_from_oneliner(line: str) -> Node:
    """One line of `scontrol show node -o` into the same Node the JSON dialects give."""
    reason, set_by, changed = "", "", None
    m = _NODE_REASON.search(line) or _NODE_REASON_BARE.search(line)
    if m:
        reason = m.group("text").strip()
        if "user" in m.groupdict():
            set_by, changed = m.group("user"), slurm_time(m.group("time"))
        line = line[: m.start()] + line[m.end() :]
    kv = parse_oneliner(line)
    name = kv.get("NodeName", "")
    if not name:
        raise SlurmParseError(["node"], None, "", f"node line without NodeName: {line[:80]!r}")
    return Node(
        name=name,
        address=_text(kv.get("NodeAddr")) or name,
        hostname=_text(kv.get("NodeHostName")) or name,
        states=_node_states(kv.get("State", "")),
        reason=reason,
        reason_set_by=set_by if reason else "",
        reason_changed_at=changed if reason else None,
        features=_words(_text(kv.get("AvailableFeatures"))),
        gres=_text(kv.get("Gres")),
        partitions=_words(_text(kv.get("Partitions"))),
        cpus=_int(kv.get("CPUTot")) or 0,
        slurmd_start_time=slurm_time(kv.get("SlurmdStartTime")),
        boot_time=slurm_time(kv.get("BootTime")),
    )


def job_from_oneliner(line: str) -> Job:
    """One line of `scontrol show job -o` into the same Job the JSON dialects give (no `flags`: the
    text form has no counterpart of the JSON's job flags, and nothing reads them)."""
    kv = parse_oneliner(line)
    job_id = _int(kv.get("JobId"))
    if job_id is None:
        raise SlurmParseError(["job"], None, "", f"job line without a JobId: {line[:80]!r}")
    nodes = tuple(expand(_text(kv.get("NodeList"))))
    return Job(
        job_id=job_id,
        name=kv.get("JobName", ""),
        state=(kv.get("JobState") or "UNKNOWN").upper(),
        nodes=nodes,
        num_nodes=len(nodes) if nodes else (_int(kv.get("NumNodes")) or 0),
        user=_text(kv.get("UserId", "").split("(")[0]),
        partition=_text(kv.get("Partition")),
        batch_host=_text(kv.get("BatchHost")),
        restart_count=_int(kv.get("Restarts")) or 0,
        state_reason=kv.get("Reason", ""),
        dependency=_text(kv.get("Dependency")),
        excluded_nodes=tuple(expand(_text(kv.get("ExcNodeList")))),
    )


def _lines(text: str, what: str, build: Callable[[str], T]) -> list[T]:
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(build(line))
        except (SlurmParseError, ValueError) as err:  # ValueError: a malformed hostlist
            log.warning("slurm_record_skipped", source=what, error=str(err)[:300])
    return out


def parse_nodes_oneliner(text: str, what: str = "scontrol show node -o") -> list[Node]:
    """Nodes from `scontrol show node [names] -o`; an odd line is skipped and logged."""
    return _lines(text, what, node_from_oneliner)


def parse_jobs_oneliner(text: str, what: str = "scontrol show job -o") -> list[Job]:
    """Jobs from `scontrol show job [id] -o`; an odd line is skipped and logged."""
    return _lines(text, what, job_from_oneliner)


def parse_node_names(text: str) -> list[str]:
    """One node name per line (`sinfo -h -N -o %N`), duplicates (a node in two partitions) dropped."""
    return list(dict.fromkeys(w for w in (line.strip() for line in text.splitlines()) if w))


REASON_GROUP_FORMAT = "%R|%D|%H|%N|%E"


def reason_group_from_line(line: str) -> ReasonGroup:
    """One `sinfo -h -o '%R|%D|%H|%N|%E'` line; the reason comes last, so a `|` inside it is kept."""
    parts = line.strip().split("|", 4)
    if len(parts) != 5 or not parts[1].strip().isdigit():
        raise ValueError(f"not a partition|count|time|nodes|reason line: {line[:200]!r}")
    partition, count, at, hosts, reason = parts
    reason = reason.strip()
    return ReasonGroup(
        partition=partition.strip().rstrip("*"),
        count=int(count),
        nodes=tuple(expand(hosts.strip())),
        reason="" if reason in ("none", "(null)") else reason,
        reason_at=slurm_time(at.strip()),
    )


def parse_reason_groups(text: str, what: str = "sinfo -o " + REASON_GROUP_FORMAT) -> list[ReasonGroup]:
    """Every line of the grouped partition view; a malformed line is skipped and logged."""
    return _lines(text, what, reason_group_from_line)


def parse_idle_names(text: str) -> list[str]:
    """Free nodes from `sinfo -h -N -t idle -o '%N|%t'`: -t idle also lists drained (`drain`) and powered-down
    (`idle~`) nodes, so only a bare `idle` counts."""
    out = []
    for line in text.splitlines():
        name, _, state = line.strip().partition("|")
        if name and state == "idle":
            out.append(name)
    return list(dict.fromkeys(out))


def parse_step_lines(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """`squeue -s -h -o %i|%j|%N` lines as (step id, name, nodes); odd lines are skipped and logged, and a
    malformed hostlist leaves that step's nodes unknown (empty) rather than failing the query."""
    steps = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or "." not in parts[0]:
            if line.strip():
                log.warning("squeue_step_line_skipped", line=line[:200])
            continue
        try:
            nodes = tuple(expand(parts[2])) if parts[2] else ()
        except SlurmParseError:
            # The step still exists: list it (it can be cancelled by id) without its nodes.
            log.warning("squeue_step_nodes_unreadable", step=parts[0], nodes=parts[2][:200])
            nodes = ()
        steps.append((parts[0], parts[1], nodes))
    return steps
