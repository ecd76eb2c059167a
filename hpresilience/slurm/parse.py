"""Pure parsers of Slurm's text output: `scontrol show ... -o`, sinfo/squeue format strings, sbatch's chatter,
`Key = Value` listings. No I/O: text in, models out. The JSON dialects are parsejson.py's; both give the same
Node and Job models.
"""

from __future__ import annotations

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


def words(value: Any) -> tuple[str, ...]:
    """A comma string or a list of strings (csv_string) as a tuple of non-empty words."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(w for w in (p.strip() for p in value.split(",")) if w)
    if isinstance(value, list):
        return tuple(str(w) for w in value if str(w))
    return ()


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
    found: list[str] = []
    for w in (p for p in text.upper().split("+") if p):
        # Older releases mark a node that does not answer as `DOWN*`; the JSON has the NOT_RESPONDING flag.
        if w.endswith("*"):
            found.append("NOT_RESPONDING")
        found.append(w.rstrip("*~#%!@^-"))
    return frozenset(w for w in found if w) or frozenset({"UNKNOWN"})


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
        features=words(_text(kv.get("AvailableFeatures"))),
        gres=_text(kv.get("Gres")),
        partitions=words(_text(kv.get("Partitions"))),
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


_RPC_TYPE_LINE = re.compile(r"^\s+([A-Z][A-Z0-9_]*)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:\d+\s+total_time:(\d+)\s*$")


def parse_rpc_stats(text: str) -> dict[str, tuple[int, int]]:
    """`sdiag`'s "Remote Procedure Call statistics by message type" (22.05 to 26.05 alike): message type ->
    (count, total microseconds slurmctld spent on it) since its start or the last `sdiag --reset`."""
    out: dict[str, tuple[int, int]] = {}
    inside = False
    for line in text.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            inside = True
        elif inside and not line.strip():
            break
        elif inside and (m := _RPC_TYPE_LINE.match(line)):
            out[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return out
