"""Reading ledgers from a login node: one job's (`hpresilience job`), and the sum over many (`goodput`).

A job's ledger is found through the job itself: Slurm's record of its working directory (slurmctld while it
knows the job, slurmdbd after), under which the wrapper keeps `.hpresilience/jobs/<id>.*` by default, or the
site's shared `autoresume.state_dir` when one is configured. A job still running has no final ledger yet: its
ledger is computed from its decision records as of now. Who ran the job and where comes from Slurm.
"""

from __future__ import annotations

import pwd
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hpresilience.goodput.ledger import Badput, Ledger, Restart, compute
from hpresilience.goodput.ledgerread import READ_TIMEOUT_S, ReadStats, read_user_records
from hpresilience.log import printable
from hpresilience.slurm.accounting import JobRecord

STATE_SUBDIR = Path(".hpresilience") / "jobs"
LIVE_STATES = frozenset(
    {
        "",
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "RESIZING",
        "SUSPENDED",
        "CONFIGURING",
        "COMPLETING",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)


def candidate_files(record: JobRecord, state_dir: str) -> list[tuple[Path, tuple[str, ...]]]:
    """Where the job's events file may be: (a base directory the user does not choose, the path below it)."""
    name = f"{record.job_id}.events.jsonl"
    out: list[tuple[Path, tuple[str, ...]]] = [(Path(state_dir), (name,))] if state_dir else []
    if record.work_dir.startswith("/"):  # a relative one would be taken from the reader's own directory
        out.append((Path(record.work_dir), (*STATE_SUBDIR.parts, name)))
    return out


def job_uid(record: JobRecord) -> int | None:
    """The uid of the user Slurm says ran the job (sacct prints a name, or the number of an unknown one)."""
    if record.user.isdigit():
        return int(record.user)
    try:
        return pwd.getpwnam(record.user).pw_uid
    except (KeyError, ValueError):
        return None


def load_ledger(
    record: JobRecord, state_dir: str, now: float | None = None, timeout_s: float = READ_TIMEOUT_S
) -> Ledger | None:
    """The job's ledger from its decision records (the ledger file is their summary at the job's end);
    None when no events file of the job is found that is a regular file of the job's user, read within
    `timeout_s` per directory (ledgerread.py: root reads it, the user wrote it)."""
    uid = job_uid(record)
    if uid is None:
        return None
    end = _slurm_end(record) or now  # a job killed before its wrapper wrote its last record ends when Slurm says

    def consume(records: Iterator[dict[str, Any]], stats: ReadStats) -> Ledger:
        ledger = compute(record.job_id, records, now=end)
        if stats.stopped:
            ledger.notes.append(
                f"read only the first {stats.records} record(s), {stats.bytes_read} bytes of the events file "
                f"(limit of {stats.stopped} reached)"
            )
        return ledger

    for base, parts in candidate_files(record, state_dir):
        ledger = read_user_records(base, parts, uid, consume, timeout_s)
        if ledger is not None:
            return ledger
    return None


def _slurm_end(record: JobRecord) -> float | None:
    if record.state in LIVE_STATES:
        return None  # a running job's EndTime is its time limit, not an end
    try:
        return datetime.fromisoformat(record.end).timestamp()  # Slurm prints the local time
    except ValueError:
        return None  # "Unknown", "None": still running


@dataclass
class ClusterGoodput:
    jobs: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    productive_s: float = 0.0
    badput_s: dict[str, float] = field(default_factory=lambda: {b.value: 0.0 for b in Badput})
    by_cause: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_node: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    restarts: int = 0
    without_ledger: int = 0

    def add(self, record: JobRecord, ledger: Ledger) -> None:
        self.jobs.append(
            {
                "job_id": record.job_id,
                "user": record.user,
                "partition": record.partition,
                "wall_s": round(ledger.wall_s, 3),
                "productive_s": round(ledger.productive_s, 3),
                "goodput": round(ledger.goodput, 4),
                "restarts": len(ledger.restarts),
                "badput_s": {k: round(v, 3) for k, v in ledger.badput_s.items()},
            }
        )
        self.wall_s += ledger.wall_s
        self.productive_s += ledger.productive_s
        for k, v in ledger.badput_s.items():
            self.badput_s[k] = self.badput_s.get(k, 0.0) + v
        self.restarts += len(ledger.restarts)
        for r in ledger.restarts:
            self.by_cause[r.cause] += r.badput_s
            for n in r.nodes:
                self.by_node[n] += _share(r)

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        nodes = sorted(self.by_node.items(), key=lambda kv: -kv[1])[:top]
        return {
            "jobs": self.jobs,
            "job_count": len(self.jobs),
            "wall_s": round(self.wall_s, 3),
            "productive_s": round(self.productive_s, 3),
            "goodput": round(self.goodput, 4),
            "badput_s": {k: round(v, 3) for k, v in self.badput_s.items()},
            "badput_by_cause_s": {k: round(v, 3) for k, v in sorted(self.by_cause.items())},
            "costliest_nodes": [{"node": n, "badput_s": round(v, 3)} for n, v in nodes],
            "restarts": self.restarts,
            "jobs_without_ledger": self.without_ledger,
        }


def _share(r: Restart) -> float:
    return r.badput_s / len(r.nodes) if r.nodes else 0.0


def render_cluster(g: ClusterGoodput) -> str:
    lines = [
        f"{len(g.jobs)} job(s): goodput {g.goodput * 100:.1f} % ({g.productive_s:.1f} s productive of "
        f"{g.wall_s:.1f} s wall), {g.restarts} restart(s)"
    ]
    bad = sorted(((v, k) for k, v in g.badput_s.items() if v > 0.0005), reverse=True)
    if bad:
        lines.append("  badput: " + ", ".join(f"{k} {v:.1f} s" for v, k in bad))
    if g.by_cause:
        causes = sorted(g.by_cause.items())  # a cause and a node name are the users' text: escaped
        lines.append("  by cause: " + ", ".join(f"{printable(k)} {v:.1f} s" for k, v in causes))
    top = sorted(g.by_node.items(), key=lambda kv: -kv[1])[:5]
    if top:
        lines.append("  costliest nodes: " + ", ".join(f"{printable(n)} {v:.1f} s" for n, v in top))
    if g.without_ledger:
        lines.append(
            f"  {g.without_ledger} job(s) without a readable ledger (not auto-resume jobs, or "
            "their directory is not readable here)"
        )
    return "\n".join(lines)
