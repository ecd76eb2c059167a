"""sacct's parsable job lines and the --since/--user/--partition arguments of the goodput commands."""

from __future__ import annotations

import pytest

from hpresilience.errors import ConfigError
from hpresilience.slurm.accounting import parse_sacct, since_seconds

# `sacct -X -n -P -o JobID,User,Partition,WorkDir,State,Start,End` as Slurm 22.05 prints it (our own lines).
SACCT = """\
41|alice|gpu|/fsx/alice/run 1|COMPLETED|2026-11-25T17:26:00|2026-11-25T17:27:00
42|bob|gpu|/fsx/bob|CANCELLED by 0|2026-11-25T17:26:05|2026-11-25T17:26:40
43_2|bob|gpu|/fsx/bob|COMPLETED|2026-11-25T17:26:05|2026-11-25T17:26:40
44+0|bob|gpu|/fsx/bob|COMPLETED|2026-11-25T17:26:05|2026-11-25T17:26:40
45|carol|cpu|/home/carol|RUNNING|2026-11-25T17:30:00|Unknown
garbage line
"""


def test_plain_job_lines_are_read_with_their_working_directory_and_first_state_word() -> None:
    jobs = parse_sacct(SACCT)
    assert [j.job_id for j in jobs] == [41, 42, 45]
    assert jobs[0].work_dir == "/fsx/alice/run 1" and jobs[0].user == "alice" and jobs[0].partition == "gpu"
    assert jobs[1].state == "CANCELLED" and jobs[2].end == "Unknown"


@pytest.mark.parametrize(("text", "seconds"), [("7d", 604800), ("12h", 43200), ("30m", 1800), ("2w", 1209600),
                                               ("90s", 90)])
def test_since_takes_a_number_and_a_unit(text: str, seconds: int) -> None:
    assert since_seconds(text) == seconds


@pytest.mark.parametrize("text", ["7", "d", "-1d", "7 days", "1e3s", ""])
def test_since_rejects_anything_else_naming_the_value(text: str) -> None:
    with pytest.raises(ConfigError, match="--since"):
        since_seconds(text)
