"""The preflight step's reader (slurm/preflight.py): the hub's lines as torch/preflight.py prints them, srun's own
error lines, and what is not ours ignored."""

from __future__ import annotations

from hpresilience.slurm.preflight import parse_preflight_output, preflight_argv

HEALTHY = """\
hpr-preflight joined node=n1 s=0.000
hpr-preflight joined node=n3 s=0.412
some line the user's profile printed
hpr-preflight allreduce s=0.002
hpr-preflight transfer node=n3 mb=4.000 s=0.041
hpr-preflight done s=0.520
"""


def test_the_hubs_lines_give_joins_transfers_and_the_end() -> None:
    rep = parse_preflight_output(HEALTHY, "", ["n1", "n3"])
    assert rep.joined == {"n1": 0.0, "n3": 0.412}
    assert rep.transfer_s == {"n3": 0.041} and rep.transfer_mb == 4.0
    assert rep.allreduce_s == 0.002 and rep.done and not rep.missing and not rep.slow


def test_missing_slow_and_failed_nodes_are_read_and_srun_named_nodes_kept() -> None:
    out = (
        "hpr-preflight joined node=n1 s=0.000\nhpr-preflight missing node=n4 waited_s=10.000\n"
        "hpr-preflight slow node=n3 after_s=19.800\n"
        "hpr-preflight error node=n2 why=RuntimeError detail=Connection_reset\n"
    )
    err = "srun: error: Task launch for StepId=7.3 failed on node n4: Communication connection failure\n"
    rep = parse_preflight_output(out, err, ["n1", "n2", "n3", "n4"])
    assert rep.missing == ["n4"] and rep.slow == {"n3": 19.8} and rep.srun_failed == ["n4"]
    assert rep.errors["n2"].startswith("RuntimeError")
    assert not rep.done


def test_lines_naming_other_nodes_or_impossible_durations_are_ignored() -> None:
    out = (
        "hpr-preflight transfer node=evil mb=4 s=0.1\nhpr-preflight transfer node=n3 mb=4 s=nan\n"
        "hpr-preflight joined node=n3 s=-1\nhpr-preflight joined node=n1 s=inf\nhpr-preflight  joined node=n1\n"
    )
    rep = parse_preflight_output(out, "", ["n1", "n3"])
    assert rep.transfer_s == {} and rep.joined == {}


def test_the_step_is_one_overlapping_task_per_node_running_the_torch_module() -> None:
    argv = preflight_argv(12, ["n1", "n3"], "/venv/bin/python")
    assert "--overlap" in argv and "--nodelist=n1,n3" in argv and "--ntasks-per-node=1" in argv
    assert "--job-name=hpr-preflight" in argv
    assert argv[-3:] == ["/venv/bin/python", "-m", "hpresilience.torch.preflight"]
