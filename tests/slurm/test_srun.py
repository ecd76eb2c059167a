"""srun's error grammar: which nodes srun says it lost, and the exit code the application set."""

from __future__ import annotations

from hpresilience.slurm.srun import application_exit_code, nodes_from_srun_errors


def test_srun_node_failure_lines() -> None:
    assert nodes_from_srun_errors(["srun: error: Node failure on n7", "srun: error: n2: task 1: Killed"]) == {"n7"}


def test_srun_node_failure_on_a_hostlist_blames_each_node() -> None:
    assert nodes_from_srun_errors(["srun: error: Node failure on n[2-3]"]) == {"n2", "n3"}


# srun 22.05's stderr on the devcluster when rank 1 exited 3 and srun then terminated rank 0 (recorded).
KILL_ON_BAD_EXIT = [
    "srun: error: n2: task 1: Exited with exit code 3",
    "srun: error: n1: task 0: Terminated",
]


def test_exit_code_of_the_first_failed_task_replaces_the_signal_srun_reports() -> None:
    assert application_exit_code(143, KILL_ON_BAD_EXIT) == 3


def test_exit_code_stays_when_the_first_task_died_of_a_signal_or_srun_said_nothing() -> None:
    assert application_exit_code(143, list(reversed(KILL_ON_BAD_EXIT))) == 143  # a task was terminated first
    assert application_exit_code(137, ["srun: error: n1: task 0: Killed"]) == 137
    assert application_exit_code(143, ["srun: error: Node failure on n1"]) == 143
    assert application_exit_code(143, []) == 143
    assert application_exit_code(143, ["srun: error: n2: task 1: Exited with exit code 0"]) == 143
    assert application_exit_code(9, KILL_ON_BAD_EXIT) == 9  # not a signal's code: srun's is kept
