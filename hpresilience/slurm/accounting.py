"""Where a job ran from, and which jobs ran, as Slurm records them: slurmctld for a job it still knows,
slurmdbd (`sacct`) for one it has forgotten (MinJobAge) and for the cluster view of `hpresilience goodput`.

The user, partition and working directory come from Slurm, never from a file a user could write: they are
what the goodput commands and the controller's job metrics group and label by, and where they look for a
job's ledger. Slurm prints the working directory raw (newlines included), so any reading of it must not let
it pass for another record or another field (docs/input-validation.md):

- every query names its own fields (squeue `-o`, sacct `-o`), the working directory (the one field a user
  writes) last, and separates them with a delimiter drawn at random for that query: no text a user wrote
  before the query ran can hold it, so each delimiter is Slurm's. Records are cut on delimiters, never on
  lines: an answer whose delimiter count is not an exact multiple of the record's is refused whole, a record
  whose job id or other fields are not what Slurm writes there is skipped and logged;
- a job's user is read from squeue's `%u`, never from `scontrol show job`'s `Key=Value` text, where a JobName
  ` UserId=root(0)` comes before the real `UserId=` and reads as it.

`sacct --json` would do as well but costs ~15 times the bytes and ~8 times the time of the delimited text for
the same records (docs/goodput.md), on every refresh of the controller's job metrics.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from hpresilience.errors import ConfigError, SlurmParseError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient

log = get_logger("hpresilience.slurm")

SACCT_FIELDS = "JobIDRaw,User,Partition,State,Start,End,WorkDir"  # WorkDir last: see the module docstring
# squeue's letters for the same fields: %A the job id (one per array element), %T the state's full name.
SQUEUE_FIELDS = ("%A", "%u", "%P", "%T", "%S", "%e", "%Z")
_COUNT = len(SQUEUE_FIELDS)
_SINCE = re.compile(r"^(\d{1,5})([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_JOB_ID = re.compile(r"[0-9]{1,18}")
# User, partition, state and times: what Slurm writes there, never a newline (only WorkDir may hold one).
_PLAIN = re.compile(r"[^\x00-\x1f\x7f]{0,256}")


@dataclass(frozen=True)
class JobRecord:
    job_id: int
    user: str
    partition: str
    work_dir: str
    state: str = ""
    start: str = ""
    end: str = ""


def since_seconds(text: str) -> int:
    """`7d`, `12h`, `30m`, `2w`, `90s` in seconds; anything else is a SlurmError naming the value."""
    m = _SINCE.match(text.strip())
    if not m:
        raise ConfigError(f"--since {text!r}: expected a number and a unit (s, m, h, d, w), e.g. 7d")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def new_delimiter() -> str:
    """A field delimiter for one query: 64 random bits, so no job field written before the query holds it."""
    return f"|hpr{secrets.token_hex(8)}|"


def parse_records(text: str, delimiter: str, what: str = "sacct") -> list[JobRecord]:
    """Records of `sacct -n -P --delimiter=D -o SACCT_FIELDS` or `squeue -h -o` of SQUEUE_FIELDS joined by D.

    Each record is 7 fields and so 6 delimiters; the last field (WorkDir) runs to the last newline before the
    next record's job id (a job id never holds one). A delimiter count that is no multiple of 6 means the
    answer is not the records asked for: refused whole (SlurmParseError)."""
    body = text[:-1] if text.endswith("\n") else text
    if not body.strip():
        return []
    tokens = body.split(delimiter)
    per = _COUNT - 1
    if (len(tokens) - 1) % per or len(tokens) == 1:
        raise SlurmParseError(
            [what], None, "", f"{what}: {len(tokens) - 1} field delimiters, not {per} per record: not what was asked"
        )
    out = []
    head = tokens[0]
    for i in range(1, len(tokens), per):
        fields = [head, *tokens[i : i + per - 1]]
        last = tokens[i + per - 1]
        if i + per < len(tokens):
            last, _, head = last.rpartition("\n")
        try:
            out.append(_record([*fields, last]))
        except ValueError as err:
            log.warning("slurm_record_skipped", source=what, error=str(err)[:300])
    return out


def _record(fields: list[str]) -> JobRecord:
    job_id, user, partition, state, start, end, work_dir = fields
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"job id {job_id[:40]!r} is not a number")
    for name, value in (("user", user), ("partition", partition), ("state", state), ("start", start), ("end", end)):
        if not _PLAIN.fullmatch(value):
            raise ValueError(f"job {job_id}: {name} {value[:80]!r} is not what Slurm writes there")
    # sacct prints `CANCELLED by 0`; the first word is the state.
    return JobRecord(int(job_id), user, partition, work_dir, state.split()[0] if state.strip() else "", start, end)


def parse_sacct(text: str, delimiter: str) -> list[JobRecord]:
    """`sacct -n -P --delimiter=D -o SACCT_FIELDS` records (see parse_records)."""
    return parse_records(text, delimiter, "sacct")


def _one(records: list[JobRecord], job_id: int, what: str) -> JobRecord | None:
    """The queried job's last record (a resized job has one per size); a record of any other job in the
    answer to a query of this one is not this job's, whatever it says: skipped and logged."""
    mine = []
    for r in records:
        if r.job_id == job_id:
            mine.append(r)
        else:
            log.warning("slurm_record_skipped", source=what, error=f"job {r.job_id} in the answer for job {job_id}")
    return mine[-1] if mine else None


def job_record(client: SlurmClient, job_id: int) -> JobRecord | None:
    """The job as slurmctld knows it (squeue, any state), else as slurmdbd recorded it; None when neither
    knows it."""
    delim = new_delimiter()
    res = client.runner.run(
        "squeue", "-h", "-t", "all", "-j", str(job_id), "-o", delim.join(SQUEUE_FIELDS), check=False, retry=False
    )
    if res.returncode == 0:
        found = _one(parse_records(res.stdout, delim, "squeue"), job_id, "squeue")
        if found is not None and found.work_dir:
            return found
    delim = new_delimiter()
    res = client.runner.run(
        "sacct", "-X", "-n", "-P", f"--delimiter={delim}", "-j", str(job_id), "-o", SACCT_FIELDS,
        check=False, retry=False,
    )  # fmt: skip
    return _one(parse_sacct(res.stdout, delim), job_id, "sacct") if res.returncode == 0 else None


def finished_jobs(client: SlurmClient, since_s: int, user: str = "", partition: str = "") -> list[JobRecord]:
    """Jobs of the last `since_s` seconds from slurmdbd (every user's with `-a`; sacct limits a non-admin
    to what PrivateData lets them see), optionally of one user or partition."""
    delim = new_delimiter()
    args = ["-X", "-n", "-P", f"--delimiter={delim}", "-o", SACCT_FIELDS, "-S", f"now-{since_s}seconds", "-E", "now"]
    for flag, value, what in (("-u", user, "--user"), ("-r", partition, "--partition")):
        if value:
            if not _NAME.match(value):
                raise ConfigError(f"{what} {value!r}: not a Slurm name")
            args += [flag, value]
    if not user:
        args.append("-a")
    res = client.runner.run("sacct", *args, retry=False)
    # A resized job has one record per size (RESIZING, then its end state): one job, its last record.
    return list({r.job_id: r for r in parse_sacct(res.stdout, delim)}.values())
