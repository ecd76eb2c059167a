"""sacct's parsable job lines and the --since/--user/--partition arguments of the goodput commands."""

from __future__ import annotations

import pytest

from hpresilience.errors import ConfigError
from hpresilience.slurm.accounting import finished_jobs, parse_sacct, since_seconds
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.fakerunner import FakeRunner

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


@pytest.mark.parametrize(
    ("text", "seconds"), [("7d", 604800), ("12h", 43200), ("30m", 1800), ("2w", 1209600), ("90s", 90)]
)
def test_since_takes_a_number_and_a_unit(text: str, seconds: int) -> None:
    assert since_seconds(text) == seconds


@pytest.mark.parametrize("text", ["7", "d", "-1d", "7 days", "1e3s", ""])
def test_since_rejects_anything_else_naming_the_value(text: str) -> None:
    with pytest.raises(ConfigError, match="--since"):
        since_seconds(text)


def test_a_resized_job_listed_once_per_size_is_one_job_with_its_last_record() -> None:
    runner = FakeRunner()
    runner.answer(
        "sacct",
        stdout="7|alice|gpu|/w|RESIZING|2026-11-25T17:00:00|2026-11-25T17:01:00\n"
        "7|alice|gpu|/w|RESIZING|2026-11-25T17:01:00|2026-11-25T17:02:00\n"
        "7|alice|gpu|/w|COMPLETED|2026-11-25T17:02:00|2026-11-25T17:09:00\n"
        "8|bob|gpu|/v|COMPLETED|2026-11-25T17:02:00|2026-11-25T17:05:00\n",
    )
    jobs = finished_jobs(SlurmClient(runner), 3600)
    assert [(j.job_id, j.state) for j in jobs] == [(7, "COMPLETED"), (8, "COMPLETED")]
    assert "-a" in runner.commands()[-1] and "now-3600seconds" in runner.commands()[-1]


def test_a_user_or_partition_that_is_no_slurm_name_is_refused_before_sacct_runs() -> None:
    runner = FakeRunner()
    with pytest.raises(ConfigError, match="--user"):
        finished_jobs(SlurmClient(runner), 60, user="a;b")
    assert not any("sacct" in c for c in runner.commands())
