"""srun's error grammar: which nodes srun says it lost, and the exit code the application set."""

from __future__ import annotations

from hpresilience.slurm.srun import (
    application_exit_code,
    nodes_from_srun_errors,
    srun_error_lines,
    strip_task_labels,
)


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


def test_only_sruns_own_error_lines_are_kept_from_a_block_of_step_output() -> None:
    block = (
        "step=3 loss=0.1\nsrun: error: Node failure on n2\n"
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
        "x srun: error: quoted by the application\nsrun: error: n2: task 1: Killed\n"
    )
    assert srun_error_lines(block) == ["srun: error: Node failure on n2", "srun: error: n2: task 1: Killed"]
    assert srun_error_lines("step=4 loss=0.09\n") == []


def test_task_labels_of_srun_label_are_removed_and_nothing_else() -> None:
    assert strip_task_labels(" 0: step=3\n12: NCCL WARN x\nstep 5: not a label\n") == (
        "step=3\nNCCL WARN x\nstep 5: not a label\n"
    )
