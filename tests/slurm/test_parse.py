"""Parsers of Slurm's text output, on real 22.05 recordings."""

from __future__ import annotations

import pytest

from hpresilience.errors import SlurmParseError
from hpresilience.slurm import parse
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"


def test_version_and_config_and_oneliner() -> None:
    assert parse.parse_version((SLURM / "scontrol_version_22.05.txt").read_text()) == (22, 5, 8)
    conf = parse.parse_key_values((SLURM / "show_config_22.05.txt").read_text())
    assert "permit_job_expansion" in conf["SchedulerParameters"]
    assert conf["SlurmdTimeout"] == "30 sec"
    one = parse.parse_oneliner((SLURM / "show_job_oneliner_22.05.txt").read_text())
    assert one["JobId"] == "1" and one["NodeList"] == "n[1-2]" and one["ExcNodeList"] == "(null)"
    assert one["BatchHost"] == "n1" and one["JobState"] == "RUNNING"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Submitted batch job 42\n", 42),
        ("salloc: Granted job allocation 7\n", 7),
        ("13\n", 13),
        ("13;hpdev\n", 13),
        ("salloc: Pending job allocation 9\nsalloc: job 9 queued", 9),
    ],
)
def test_job_id_from_submit_output(text: str, expected: int) -> None:
    assert parse.parse_job_id(text) == expected


def test_job_id_missing_is_an_error() -> None:
    with pytest.raises(SlurmParseError):
        parse.parse_job_id("sbatch: error: Batch job submission failed")


@pytest.mark.parametrize("text", ["slurm 22.05.²", "slurm " + "1" * 5000 + "x.1.1", "slurm ²²." + "1" * 5000])
def test_version_with_odd_digits_is_a_parse_error(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse.parse_version(text)


@pytest.mark.parametrize("text", ["²", "9" * 5000, "Submitted batch job " + "9" * 5000])
def test_job_id_with_odd_digits_is_a_parse_error(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse.parse_job_id(text)


def test_step_lines_skip_odd_lines_and_keep_steps_with_bad_hostlists() -> None:
    """`squeue -s` text: a malformed node list leaves that step's nodes unknown instead of failing the query
    (it raised SlurmParseError past a `except ValueError` before issue 14)."""
    text = "12.0|train|n[1-2]\n12.1|probe|n[1-\ngarbage\n12.batch|batch|n1\n\n13|job|n1\n"
    assert parse.parse_step_lines(text) == [
        ("12.0", "train", ("n1", "n2")),
        ("12.1", "probe", ()),
        ("12.batch", "batch", ("n1",)),
    ]


def test_reason_groups_read_recorded_sinfo_output_with_a_bar_inside_a_reason() -> None:
    """22.05's `sinfo -h -o '%R|%D|%H|%N|%E'`: one line per (partition, reason); sizes add up; "none" is no reason."""
    from pathlib import Path

    from hpresilience.slurm.parse import parse_reason_groups

    text = (Path(__file__).parents[1] / "fixtures" / "slurm" / "sinfo_reason_groups_22.05.txt").read_text()
    groups = parse_reason_groups(text + "garbage line\n")
    assert sum(g.count for g in groups) == 4 and {g.partition for g in groups} == {"debug"}
    by_node = {n: g for g in groups for n in g.nodes}
    assert by_node["n2"].reason == "Action:Replace [hpr-agent] xid: GPU | fell off"
    assert by_node["n4"].reason.startswith("hpr: needs a person") and by_node["n4"].reason_at
    assert by_node["n1"].reason == "" and by_node["n1"].reason_at is None
