"""launch/pernode.py: a node's step of the in-process mode keeps a user's own `--export` and still carries what
the step is placed by (its world file, first rank, generation) and the job's shape."""

from __future__ import annotations

from hpresilience.autoresume.launch.pernode import StepCommand, node_step_env
from hpresilience.autoresume.launch.standby import standby_step_env


def step_argv(
    tasks: int, command: list[str], user_export: str | None, node: str, name: str, env: dict[str, str]
) -> list[str]:
    return StepCommand("srun", 7, tasks, (), tuple(command), user_export).argv(node, name, env)


def export_of(argv: list[str]) -> str:
    (value,) = [a.split("=", 1)[1] for a in argv if a.startswith("--export=")]
    return value


def test_a_users_export_list_is_kept_and_the_in_process_placement_is_added_to_it() -> None:
    base = {"PATH": "/bin", "NODE_LIST": "n1,n2", "MASTER_ADDR": "n1", "HPR_NOTICE_FILE": "/s/notice"}
    env = node_step_env(base, "/s/7.world.json", 1, 2, 3)
    argv = step_argv(2, ["python", "t.py"], "PATH,MYVAR", "n2", "hpr-x", env)
    names = export_of(argv).split(",")
    assert names[:2] == ["PATH", "MYVAR"]
    for carried in ("HPR_WORLD_FILE", "HPR_RANK_BASE", "HPR_GENERATION", "NODE_LIST", "MASTER_ADDR", "HPR_NOTICE_FILE"):
        assert carried in names, carried
    assert "HPR_STANDBY_NODE" not in names  # not in this step's environment


def test_export_none_carries_only_the_wrappers_variables_and_all_stays_all() -> None:
    env = standby_step_env({"NODE_LIST": "n1"}, "/s/w.json", "n3", 4)
    none = export_of(step_argv(1, ["t"], "NONE", "n3", "s", env)).split(",")
    assert "NONE" not in none and "HPR_STANDBY_NODE" in none and "HPR_WORLD_FILE" in none
    assert export_of(step_argv(1, ["t"], None, "n3", "s", env)) == "ALL"
    assert export_of(step_argv(1, ["t"], "ALL,X=1", "n3", "s", env)) == "ALL,X=1"
