"""Where a job ran from, and which jobs ran, as Slurm records them: slurmctld for a job it still knows,
slurmdbd (`sacct`) for one it has forgotten (MinJobAge) and for the cluster view of `hpresilience goodput`.

The user, partition and working directory come from Slurm, never from a file a user could write: they are
what the goodput commands group by and where they look for a job's ledger.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpresilience.errors import ConfigError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.parse import parse_oneliner

SACCT_FIELDS = "JobID,User,Partition,WorkDir,State,Start,End"
_SINCE = re.compile(r"^(\d{1,5})([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


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


def parse_sacct(text: str) -> list[JobRecord]:
    """`sacct -X -n -P -o SACCT_FIELDS` lines; array or het-job ids (`12_3`, `12+0`) and odd lines are skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 7 or not parts[0].isdigit():
            continue
        out.append(
            JobRecord(
                int(parts[0]), parts[1], parts[2], parts[3], parts[4].split()[0] if parts[4] else "", parts[5], parts[6]
            )
        )
    return out


def job_record(client: SlurmClient, job_id: int) -> JobRecord | None:
    """The job as slurmctld knows it, else as slurmdbd recorded it; None when neither knows it."""
    res = client.runner.run("scontrol", "show", "job", "-o", str(job_id), check=False, retry=False)
    if res.returncode == 0:
        d = parse_oneliner(res.stdout)
        if d.get("WorkDir"):
            user = d.get("UserId", "").split("(")[0]
            return JobRecord(
                job_id,
                user,
                d.get("Partition", ""),
                d["WorkDir"],
                d.get("JobState", ""),
                d.get("StartTime", ""),
                d.get("EndTime", ""),
            )
    res = client.runner.run("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", SACCT_FIELDS, check=False, retry=False)
    found = [r for r in parse_sacct(res.stdout) if r.job_id == job_id] if res.returncode == 0 else []
    return found[-1] if found else None


def finished_jobs(client: SlurmClient, since_s: int, user: str = "", partition: str = "") -> list[JobRecord]:
    """Jobs of the last `since_s` seconds from slurmdbd (every user's with `-a`; sacct limits a non-admin
    to what PrivateData lets them see), optionally of one user or partition."""
    args = ["-X", "-n", "-P", "-o", SACCT_FIELDS, "-S", f"now-{since_s}seconds", "-E", "now"]
    for flag, value, what in (("-u", user, "--user"), ("-r", partition, "--partition")):
        if value:
            if not _NAME.match(value):
                raise ConfigError(f"{what} {value!r}: not a Slurm name")
            args += [flag, value]
    if not user:
        args.append("-a")
    res = client.runner.run("sacct", *args, retry=False)
    # A resized job has one record per size (RESIZING, then its end state): one job, its last record.
    return list({r.job_id: r for r in parse_sacct(res.stdout)}.values())
