"""The slurm.conf lines printed for the admin, merged against the slurm.conf already in place."""

from __future__ import annotations

from pathlib import Path

from hpresilience.install.layout import Layout, render
from hpresilience.slurm.conf import merge_lines, parse_settings


def snippet() -> str:
    return render("slurm.conf.hpresilience", Layout(Path("/")))


def test_all_lines_when_there_is_no_slurm_conf() -> None:
    lines = merge_lines(snippet(), None)
    assert "HealthCheckProgram=/opt/hpresilience/slurm/healthcheck.sh" in lines
    assert "SchedulerParameters=permit_job_expansion" in lines


def test_permit_job_expansion_is_appended_to_existing_scheduler_parameters() -> None:
    """A second SchedulerParameters= line would replace the site's: the printed line keeps them."""
    lines = merge_lines(snippet(), "SchedulerParameters=bf_continue,bf_interval=60\nNodeName=a CPUs=2\n")
    assert [ln.split("#")[0].strip() for ln in lines if ln.startswith("SchedulerParameters")] == [
        "SchedulerParameters=bf_continue,bf_interval=60,permit_job_expansion"
    ]


def test_settings_already_in_place_are_not_repeated() -> None:
    existing = "HealthCheckInterval=300\nSchedulerParameters=permit_job_expansion\nReturnToService=2\n"
    lines = merge_lines(snippet(), existing)
    assert not any(ln.startswith(("HealthCheckInterval", "SchedulerParameters")) for ln in lines)
    assert any(ln.startswith("ReturnToService=1") and "you have ReturnToService=2" in ln for ln in lines)


def test_snippet_values_match_what_its_comments_say() -> None:
    """ReturnToService=1 (only non-responsive DOWN nodes return by themselves: our DOWN/FAIL wait for the
    controller's health gate); ResumeTimeout long enough for a GPU server's reboot."""
    values = {s.key: s.value for s in parse_settings(snippet())}
    assert values["ReturnToService"] == "1"
    assert int(values["ResumeTimeout"]) >= 900
    assert "APPEND to an existing line" in snippet()
    assert "(2 would return every DOWN node" in snippet()


def test_node_and_partition_lines_are_not_settings() -> None:
    assert parse_settings(
        "NodeName=n[1-4] CPUs=2 State=UNKNOWN\nPartitionName=p Nodes=ALL\nX=1 # c\n"
    ) == parse_settings("X=1")
