"""The slurm.conf lines an admin must merge, worked out against the slurm.conf already in place.

hpresilience never edits slurm.conf (the cluster's owner, a HyperPod agent or a config manager, does):
the installer prints what to add or change. A key already set to our value is left out; an existing
SchedulerParameters= gets permit_job_expansion appended to its list (a second line would replace the
first one, dropping the site's parameters); any other key set to something else is shown with the
site's value so the admin decides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    key: str
    value: str


def parse_settings(text: str) -> list[Setting]:
    """`Key=Value` lines (comments and node/partition definitions skipped); the last one of a key wins."""
    out: dict[str, Setting] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip()
        # NodeName=/PartitionName= lines carry several settings per line: not global settings.
        if not key or " " in key or key.lower() in ("nodename", "partitionname", "nodeset", "downnodes"):
            continue
        out[key.lower()] = Setting(key, value.strip())
    return list(out.values())


def merge_lines(snippet: str, existing: str | None) -> list[str]:
    """The lines to put in slurm.conf: ours, adjusted to what `existing` (the current file) already says."""
    have = {s.key.lower(): s for s in parse_settings(existing or "")}
    lines: list[str] = []
    for want in parse_settings(snippet):
        cur = have.get(want.key.lower())
        if cur is None:
            lines.append(f"{want.key}={want.value}")
        elif want.key.lower() == "schedulerparameters":
            params = [p for p in cur.value.split(",") if p]
            missing = [p for p in want.value.split(",") if p and p not in params]
            if missing:
                lines.append(f"{cur.key}={','.join(params + missing)}    # replaces your {cur.key}= line")
        elif cur.value != want.value:
            lines.append(f"{want.key}={want.value}    # you have {cur.key}={cur.value}; keep yours if it is deliberate")
    return lines
