"""Unit tests of the wrapper's pure parts: srun argument split, node planning, environment, classifier,
state file, decision log and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpresilience.autoresume.decide.classify import Cause, classify
from hpresilience.autoresume.launch.plan import AttemptLaunch, carried_names, master_port, plan_nodes
from hpresilience.autoresume.launch.srunargs import parse_srun_args
from hpresilience.autoresume.launch.stepops import flight_recorder_env
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import JobIdentity, WrapperState, WrapperStateStore, belongs_to
from hpresilience.autoresume.watch.nodewatch import node_is_bad
from hpresilience.errors import ConfigError
from hpresilience.slurm.jobs import REQUEUE_MARKER, with_requeue_marker
from hpresilience.slurm.models import Node


def node(name: str, *states: str, reason: str = "") -> Node:
    return Node(name=name, address="127.0.0.1", hostname="h", states=frozenset(states or ("ALLOCATED",)), reason=reason)


# -- srun arguments --------------------------------------------------------------------------------------
def test_srun_args_split_at_the_command_and_keep_its_own_options() -> None:
    a = parse_srun_args(["-N", "2", "--ntasks-per-node=1", "--cpu-bind", "none", "python", "train.py", "-N", "5"])
    assert a.command == ["python", "train.py", "-N", "5"]
    assert a.nodes == 2 and a.ntasks_per_node == 1
    assert a.passthrough == ["--cpu-bind", "none"]


def test_controlled_options_are_dropped_so_a_relaunch_is_never_pinned_to_old_nodes() -> None:
    a = parse_srun_args(["-w", "n1,n2", "--exclude=n3", "-K", "--jobid", "7", "-l", "cmd"])
    assert a.command == ["cmd"]
    assert "-w" not in a.passthrough and "--exclude=n3" not in a.passthrough and "--jobid" not in a.passthrough
    assert a.passthrough == ["-l"]
    assert "n1,n2" in a.dropped


def test_tasks_per_node_from_ntasks_and_nodes() -> None:
    assert parse_srun_args(["-N2", "-n4", "x"]).tasks_per_node() == 2
    assert parse_srun_args(["x"]).tasks_per_node() == 1


def test_wrapper_options_found_among_srun_options() -> None:
    a = parse_srun_args(
        ["-N", "2", "--auto-resume-spares", "1", "--auto-resume-grow", "cmd"],
        frozenset({"auto-resume-spares"}),
        frozenset({"auto-resume-grow"}),
    )
    assert a.own == {"auto-resume-spares": "1", "auto-resume-grow": "1"}
    assert a.command == ["cmd"] and a.nodes == 2


@pytest.mark.parametrize("args", [[], ["-N", "2"], ["-N"], ["-N", "zero", "cmd"]])
def test_bad_srun_arguments_are_config_errors(args: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_srun_args(args)


# -- planning ---------------------------------------------------------------------------------------
def test_first_plan_takes_the_first_healthy_nodes_and_leaves_spares() -> None:
    assert plan_nodes(["n1", "n2", "n3"], 2) == ["n1", "n2"]
    assert plan_nodes(["n1", "n2", "n3"], 2, bad=["n1"]) == ["n2", "n3"]


def test_replacement_takes_the_failed_nodes_slot_and_survivors_keep_theirs() -> None:
    assert plan_nodes(["n1", "n2", "n3", "n4"], 3, bad=["n1"], previous=["n1", "n2", "n3"]) == ["n4", "n2", "n3"]
    assert plan_nodes(["n1", "n2", "n3", "n4"], 3, bad=["n2"], previous=["n3", "n2", "n1"]) == ["n3", "n4", "n1"]


def test_plan_is_none_when_too_few_healthy_nodes() -> None:
    assert plan_nodes(["n1", "n2"], 2, bad=["n2"], previous=["n1", "n2"]) is None


def test_master_port_changes_every_attempt_and_stays_in_range() -> None:
    ports = {master_port(29500, 20000, 12345, a) for a in range(1, 50)}
    assert len(ports) == 49 and all(29500 <= p < 49500 for p in ports)


def test_master_port_of_first_jobs_of_clusters_numbered_from_round_ids_differ() -> None:
    # devclusters number jobs from base_port * 1000: 20000000 and 21000000 once shared a port.
    firsts = {master_port(29500, 20000, base * 1000, 0) for base in range(20000, 27000, 1000)}
    assert len(firsts) == 7


def test_environment_refreshes_node_list_master_and_drops_stale_shape() -> None:
    launch = AttemptLaunch(2, ("n3", "n2"), ("n1", "n2", "n3"), "127.0.0.13", 30001, 1)
    env = launch.environment({"SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]", "KEEP": "x"}, restarts=1)
    assert env["NODE_LIST"] == "n3,n2" and env["MASTER_ADDR"] == "127.0.0.13" and env["NNODES"] == "2"
    assert env["SLURM_JOB_NODELIST"] == "n[1-3]" and env["SLURM_NNODES"] == "3"
    assert env["AUTORESUME_ATTEMPT"] == "2" and "SLURM_NTASKS" not in env and env["KEEP"] == "x"


def test_a_short_step_tells_its_size_and_the_requested_one() -> None:
    """Running short (min_nodes): the step's shape is the nodes it runs on, the job's size stays requested."""
    launch = AttemptLaunch(3, ("n1", "n2"), ("n1", "n2", "n3"), "127.0.0.11", 30001, 1, requested=3)
    env = launch.environment({}, restarts=1)
    assert env["SLURM_NNODES"] == env["SLURM_JOB_NUM_NODES"] == env["HPR_NODES_NOW"] == "2"
    assert env["HPR_NODES_REQUESTED"] == "3" and env["SLURM_JOB_NODELIST"] == "n[1-2]"
    assert "HPR_NODES_NOW" in carried_names() and "HPR_NODES_REQUESTED" in carried_names()
    full = AttemptLaunch(3, ("n1", "n2", "n3"), ("n1", "n2", "n3"), "a", 1, 1, requested=3).environment({}, 0)
    assert full["HPR_NODES_NOW"] == full["HPR_NODES_REQUESTED"] == full["SLURM_NNODES"] == "3"


def test_srun_command_line_is_explicit_and_ordered() -> None:
    launch = AttemptLaunch(1, ("n3", "n2"), ("n2", "n3"), "a", 1, 2)
    argv = launch.srun_argv("/bin/srun", 9, "step", ["-J", "mine"], ["train.sh"], user_export="NONE")
    assert "--nodelist=n3,n3,n2,n2" in argv and "--distribution=arbitrary" in argv and "--ntasks=4" in argv
    assert "--kill-on-bad-exit=1" in argv and "--jobid=9" in argv
    # Slurm 24.11 and 26.05 refuse --nodes beside --distribution=arbitrary: the task list alone sets the nodes.
    assert not any(a.startswith(("--nodes", "-N")) for a in argv[: argv.index("--job-name=step")])
    assert argv[-2:] == ["--job-name=step", "train.sh"]  # our step name wins over the user's -J
    export = next(a for a in argv if a.startswith("--export="))
    assert "NODE_LIST" in export and "MASTER_ADDR" in export


# -- classification ---------------------------------------------------------------------------------
def test_node_states_that_mean_hardware() -> None:
    assert node_is_bad(node("a", "ALLOCATED", "FAIL", reason="Action:Replace"))
    assert node_is_bad(node("a", "IDLE", "DOWN"))
    assert node_is_bad(node("a", "ALLOCATED", "DRAIN", reason="Action:Reboot [hpr-agent] xid"))
    assert not node_is_bad(node("a", "ALLOCATED", "DRAIN", reason="maintenance next week"))
    assert not node_is_bad(node("a", "ALLOCATED"))


def test_classify_hardware_from_node_state_excision_and_srun_errors() -> None:
    states = {"n1": node("n1"), "n2": node("n2", "ALLOCATED", "FAIL", reason="Action:Replace")}
    d = classify(137, ["n1", "n2"], states, ["n1", "n2"])
    assert d.cause is Cause.HARDWARE and d.bad_nodes == ("n2",)
    d = classify(137, ["n1", "n2"], {"n1": node("n1")}, ["n1"])
    assert d.cause is Cause.HARDWARE and d.bad_nodes == ("n2",) and "excised" in d.detail
    d = classify(1, ["n1", "n2"], {}, ["n1", "n2"], srun_errors=["srun: error: Node failure on n1"])
    assert d.bad_nodes == ("n1",)


def test_classify_rule_then_application_then_success() -> None:
    healthy = {"n1": node("n1")}
    assert classify(137, ["n1"], healthy, ["n1"], rule_fired=(Cause.HANG, "x")).cause is Cause.HANG
    d = classify(3, ["n1"], healthy, ["n1"])
    assert d.cause is Cause.APPLICATION and "3" in d.detail
    assert classify(0, ["n1"], healthy, ["n1"]).cause is Cause.NONE


# -- state and reports ------------------------------------------------------------------------------
def test_state_round_trips_and_a_corrupt_file_is_set_aside(tmp_path: Path) -> None:
    store = WrapperStateStore(tmp_path, 42)
    st = WrapperState(42, attempts=3, blamed_nodes=["n2"], resized=True, policy={"version": 1})
    store.save(st)
    assert store.load() == st
    store.path.write_text("{not json")
    fresh = store.load()
    assert fresh.attempts == 0 and (tmp_path / "42.json.bad").exists()


def test_state_of_another_job_is_not_taken(tmp_path: Path) -> None:
    WrapperStateStore(tmp_path, 1).save(WrapperState(1, attempts=5))
    (tmp_path / "2.json").write_text((tmp_path / "1.json").read_text())
    assert WrapperStateStore(tmp_path, 2).load().attempts == 0


RUN = JobIdentity("hpdev", 7, "2026-11-25T02:18:28", 0)


def test_a_later_run_of_the_same_job_continues_its_state(tmp_path: Path) -> None:
    """The same batch run (a second wrapper) and a requeued run (new submit time, one more restart) both
    continue the file: Slurm gives a requeued job a new SubmitTime, so the restart count tells them apart."""
    store = WrapperStateStore(tmp_path, 7)
    store.save(WrapperState(7, cluster="hpdev", submit_time=RUN.submit_time, attempts=3))
    assert store.load(RUN).attempts == 3
    requeued = JobIdentity("hpdev", 7, "2026-11-25T02:18:32", 1)
    loaded = store.load(requeued)
    assert loaded.attempts == 3 and loaded.submit_time == requeued.submit_time and store.set_aside is None


@pytest.mark.parametrize(
    ("saved", "why"),
    [
        (WrapperState(7, cluster="hpdev", submit_time="2026-11-20T10:00:00"), "submitted at 2026-11-20T10:00:00"),
        (WrapperState(7, cluster="other", submit_time=RUN.submit_time), "of cluster 'other'"),
        (WrapperState(7, cluster="hpdev", submit_time="2026-11-20T10:00:00", slurm_restart_count=2), "restart 2"),
    ],
)
def test_the_state_of_another_job_with_the_same_id_is_set_aside(tmp_path: Path, saved: WrapperState, why: str) -> None:
    """A reinstalled cluster (same id, another submit time), another cluster sharing the directory, or a
    file counting more requeues than this job: never used, moved aside with its events, and said why."""
    store = WrapperStateStore(tmp_path, 7)
    saved.attempts = 2
    saved.blamed_nodes = ["n1"]
    store.save(saved)
    store.events_path.write_text('{"event": "old"}\n')
    fresh = store.load(RUN)
    assert fresh.attempts == 0 and fresh.blamed_nodes == [] and fresh.submit_time == RUN.submit_time
    assert store.set_aside is not None and why in store.set_aside["why"]
    assert not store.path.exists() and not store.events_path.exists()
    assert len(list(tmp_path.glob("7.json.foreign-*"))) == 1
    assert len(list(tmp_path.glob("7.events.jsonl.foreign-*"))) == 1


def test_a_missing_identity_never_adopts_a_state_file(tmp_path: Path) -> None:
    """Without this job's submit time (Slurm unreadable at start) or without the file's, the file cannot be
    shown to be this job's: it is set aside, whatever the restart counts say."""
    assert belongs_to(WrapperState(7, slurm_restart_count=0), JobIdentity("", 7, "", 1)) is not None
    assert belongs_to(WrapperState(7, submit_time=RUN.submit_time), JobIdentity("hpdev", 7, "", 0)) is not None
    assert belongs_to(WrapperState(7, cluster="hpdev"), RUN) is not None
    assert belongs_to(WrapperState(8), RUN) is not None
    store = WrapperStateStore(tmp_path, 7)
    store.save(WrapperState(7, cluster="hpdev", submit_time=RUN.submit_time, attempts=4))
    assert store.load(JobIdentity("hpdev", 7, "", 0)).attempts == 0
    assert store.set_aside is not None and "submit time could not be read" in store.set_aside["why"]


@pytest.mark.parametrize("comment", ["", "exp7 lr=0.1 bs=64", "  two  spaces ", "a\tb=c", "x=1|y=2", "hpr:requeuedX"])
def test_the_requeue_marker_keeps_the_users_comment_byte_for_byte(comment: str) -> None:
    marked = with_requeue_marker(comment, True)
    assert REQUEUE_MARKER in marked.split()
    assert with_requeue_marker(marked, True) == marked
    assert with_requeue_marker(marked, False) == comment
    assert with_requeue_marker(f"{REQUEUE_MARKER} {comment}", False) == comment
    assert with_requeue_marker(f"a {REQUEUE_MARKER} b=1", False) == "a b=1"


def test_each_decision_is_a_json_line_and_metrics_are_written(tmp_path: Path) -> None:
    store = WrapperStateStore(tmp_path, 7)
    prom = tmp_path / "m" / "7.prom"
    rep = Reporter(store, 7, str(prom))
    rep.count_restart("hardware")
    rep.observe_restart(0.4)
    rep.observe_detection(1.2)
    rep.set_attempts(2)
    rep.decision("node_swapped", nodes="n3,n2", ignored=None)
    lines = store.events_path.read_text().splitlines()
    rec = json.loads(lines[-1])
    assert rec["event"] == "node_swapped" and rec["job_id"] == 7 and "ignored" not in rec
    text = prom.read_text()
    assert 'hpr_autoresume_restarts_total{cause="hardware",job_id="7"} 1.0' in text
    assert 'hpr_autoresume_attempts{job_id="7"} 2.0' in text
    assert "hpr_autoresume_restart_latency_seconds_count" in text
    assert "hpr_autoresume_fault_detection_latency_seconds_sum" in text


@pytest.mark.parametrize("user_export", ["NONE", "PATH,HOME", "none"])
def test_a_users_export_list_still_carries_every_variable_the_wrapper_gives_the_ranks(user_export: str) -> None:
    """Issue 32: with `--export=NONE` or a list, HPR_NOTICE_FILE, HPR_HEARTBEAT_EVERY_S, HPR_EVIDENCE_DIR and the
    flight recorder's TORCH_* did not reach the ranks, so check_alive() never saw a move notice. The environment
    is built as StepRunner.run_attempt builds it; every variable the wrapper added is in the export list."""
    base = {"PATH": "/usr/bin", "HOME": "/home/u", "SLURM_JOB_ID": "9"}
    launch = AttemptLaunch(1, ("n3", "n2"), ("n2", "n3"), "a", 1, 2)
    env = launch.environment(base, restarts=0)
    env["HPR_HEARTBEAT_EVERY_S"] = "5"
    env["HPR_EVIDENCE_DIR"] = "/shared/ev/attempt-1"
    flight_recorder_env(env, "/shared/ev/attempt-1", 2000)
    env["HPR_NOTICE_FILE"] = "/tmp/hpr-0-abc/notice"
    argv = launch.srun_argv("/bin/srun", 9, "step", [], ["train.sh"], user_export=user_export, env=env)
    export = next(a for a in argv if a.startswith("--export=")).removeprefix("--export=").split(",")
    added = {k for k, v in env.items() if base.get(k) != v}
    assert added <= set(export), added - set(export)
    assert {"HPR_NOTICE_FILE", "HPR_HEARTBEAT_EVERY_S", "HPR_EVIDENCE_DIR", "TORCH_NCCL_DUMP_ON_TIMEOUT"} <= added
    assert ("PATH" in export) == (user_export == "PATH,HOME")  # the user's own choice of the rest stands


def test_the_export_list_names_only_the_rank_variables_the_step_has() -> None:
    launch = AttemptLaunch(1, ("n1",), ("n1",), "a", 1, 1)
    env = launch.environment({}, restarts=0)
    argv = launch.srun_argv("/bin/srun", 9, "step", [], ["x"], user_export="NONE", env=env)
    assert "HPR_EVIDENCE_DIR" not in next(a for a in argv if a.startswith("--export="))
