"""The fake runner answers by argv prefix and records each call; what it cannot answer fails the test."""

from __future__ import annotations

import pytest

from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.fakerunner import FakeRunner, NoAnswer


def test_the_longest_matching_prefix_answers() -> None:
    runner = FakeRunner(None).answer("sinfo", stdout="any").answer("sinfo", "-h", "-a", stdout="7\n")
    assert runner.run("sinfo", "-h", "-a", "-o", "%D").stdout == "7\n"
    assert runner.run("sinfo", "--json").stdout == "any"


def test_answers_for_one_prefix_come_in_order_and_the_last_repeats() -> None:
    runner = FakeRunner(None).answer("squeue", stdout="1").answer("squeue", stdout="2")
    assert [runner.run("squeue").stdout for _ in range(3)] == ["1", "2", "2"]


def test_an_unscripted_command_fails_naming_it() -> None:
    with pytest.raises(NoAnswer, match="`scancel 5`"):
        FakeRunner(None).run("scancel", "5")


def test_calls_record_argv_env_and_cwd_and_the_version_is_scripted() -> None:
    runner = FakeRunner("24.05.1").answer("sbatch", stdout="17\n")
    client = SlurmClient(runner)
    assert client.version == (24, 5, 1)
    assert client.sbatch("--wrap", "true", env={"SLURM_CONF": "/x"}) == 17
    call = runner.calls[-1]
    assert call.argv == ("sbatch", "--parsable", "--wrap", "true") and call.env["SLURM_CONF"] == "/x"
    assert runner.commands() == ["scontrol --version", "sbatch --parsable --wrap true"]
