"""Repair records on disk, the controller lock, and configuration errors that name what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from hpresilience.config import config_from_mapping
from hpresilience.controller.gates import GateSettings, create_gate
from hpresilience.controller.loop import Controller
from hpresilience.controller.providers import ProviderContext, create_provider
from hpresilience.controller.settings import ControllerSettings, NodeGroup
from hpresilience.controller.state import FOR_A_PERSON, ControllerLocked, RepairRecord, StateStore, Step
from hpresilience.controller.steps import STEP_FUNCTIONS
from hpresilience.errors import ConfigError
from hpresilience.reasons import Action
from hpresilience.slurm.client import SlurmClient


def record(node: str = "n1") -> RepairRecord:
    return RepairRecord(
        node=node, requested=Action.REPLACE, reason="Action:Replace", provider="script", detected_at=1.0
    )


def test_record_round_trips_and_keeps_a_bounded_history(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    rec = record()
    for i in range(30):
        rec.move(Step.PENDING if i % 2 else Step.ACTING, f"step {i}", now=float(i))
    rec.last_health = {"passed": False, "detail": "exit 1"}
    store.save(rec)
    back = store.load_all()["n1"]
    assert back == rec and len(back.history) == 20 and back.history[-1]["why"] == "step 29"
    assert not list((tmp_path / "nodes").glob("*.tmp")) and not list((tmp_path / "nodes").glob(".*"))


def test_finish_removes_the_record_and_appends_history(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    rec = record()
    store.save(rec)
    store.finish(rec, "repaired")
    assert store.load_all() == {}
    assert [h["outcome"] for h in store.history()] == ["repaired"]


def test_corrupt_record_is_set_aside_not_fatal(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(record("n2"))
    (tmp_path / "nodes" / "n1.json").write_text("{not json")
    (tmp_path / "nodes" / "n3.json").write_text(json.dumps({**record("n3").to_json(), "step": "dancing"}))
    assert list(store.load_all(quarantine=False)) == ["n2"]
    assert (tmp_path / "nodes" / "n1.json").exists()
    assert list(store.load_all()) == ["n2"]
    assert sorted(p.name for p in (tmp_path / "nodes").iterdir()) == ["n1.corrupt", "n2.json", "n3.corrupt"]


def test_dry_run_store_writes_nothing(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s", persist=False)
    store.save(record())
    store.finish(record(), "repaired")
    assert not (tmp_path / "s").exists()


def test_second_controller_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    first, second = StateStore(tmp_path), StateStore(tmp_path)
    first.lock()
    try:
        with pytest.raises(ControllerLocked, match=r"another controller \(pid \d+\)"):
            second.lock()
    finally:
        first.unlock()
    second.lock()
    second.unlock()


def test_node_names_that_could_escape_the_state_dir_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot name a state file"):
        StateStore(tmp_path).save(record("../etc/passwd"))


def test_unknown_provider_and_gate_list_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown provider 'ipmi'; known: ec2, hyperpod, reboot, script"):
        create_provider("ipmi", {}, ProviderContext(SlurmClient(), "default"))
    with pytest.raises(ValidationError, match="unknown gate 'nhc'; known: command, none, slurm"):
        GateSettings(kind="nhc")  # refused when the settings load (issue 11 defect 3) ...
    with pytest.raises(ConfigError, match="unknown gate 'nhc'; known: command, none, slurm"):
        create_gate(GateSettings.model_construct(kind="nhc"))  # ... and still when a gate is made
    with pytest.raises(ValidationError, match="unknown placeholder"):
        GateSettings(kind="command", command=["ssh", "{nodename}"])  # refused at load ...
    with pytest.raises(ConfigError, match="unknown placeholder"):
        create_gate(GateSettings.model_construct(kind="command", command=["ssh", "{nodename}"]))  # ... and at start


def test_a_bad_group_is_refused_at_load_and_at_start(tmp_path: Path) -> None:
    group = {"name": "gpu", "nodes": ["gpu-*"], "provider": "script", "options": {"timeout_s": 5}}
    with pytest.raises(ValidationError) as err:
        ControllerSettings(state_dir=str(tmp_path), groups=[group])  # type: ignore[list-item]
    assert [(e["loc"], e["msg"]) for e in err.value.errors()] == [
        (("groups", 0, "options", "command"), "Field required")
    ]
    # Settings made without validation still cannot start a controller with it.
    s = ControllerSettings.model_construct(state_dir=str(tmp_path), groups=[NodeGroup.model_validate(group)])
    with pytest.raises(ConfigError, match="group 'gpu', provider 'script': command: Field required"):
        Controller(s, SlurmClient())


def test_config_file_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"controller\.ladder.*must contain 'replace'"):
        config_from_mapping({"controller": {"ladder": ["reboot"]}})
    with pytest.raises(ConfigError, match=r"controller.groups\[0\].nodes"):
        config_from_mapping({"controller": {"groups": [{"name": "x", "nodes": []}]}})
    with pytest.raises(ConfigError, match=r"controller\.max_concurent: unknown key"):
        config_from_mapping({"controller": {"max_concurent": 2}})


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        (
            [{"name": "gpu", "nodes": ["gpu-[1-"]}],
            r"groups\[0\]\.nodes: Value error, bad hostlist expression 'gpu-\[1-'",
        ),
        ([{"name": "gpu", "nodes": ["gpu-[3-1]"]}], r"groups\[0\]\.nodes: Value error, bad hostlist expression"),
        ([{"name": "gpu", "nodes": ["gpu-1]"]}], r"groups\[0\]\.nodes: Value error, bad hostlist expression"),
        ([{"name": "gpu", "nodes": [" "]}], r"groups\[0\]\.nodes: Value error, an empty node pattern"),
        ([{"name": "a", "nodes": ["a-*"]}, {"name": "a", "nodes": ["b-*"]}], "node group name 'a' is used twice"),
        ([{"name": "default", "nodes": ["a-*"]}], "node group name 'default' is reserved"),
        ([{"name": "", "nodes": ["a-*"]}], r"groups\[0\]\.name"),
    ],
)
def test_bad_node_groups_are_refused_at_load(groups: list[dict[str, object]], message: str) -> None:
    """Issue 14 item 9: a hostlist typo passed `config show` and `--dry-run --once`, then failed every cycle
    while no node was repaired; duplicate names and `default` (the name of nodes in no group) were accepted."""
    with pytest.raises(ConfigError, match=message):
        config_from_mapping({"controller": {"groups": groups}}, "c.yaml")


def test_good_hostlists_and_globs_still_load() -> None:
    cfg = config_from_mapping({"controller": {"groups": [{"name": "gpu", "nodes": ["gpu-[1-64,70]", "trn-*"]}]}})
    assert cfg.controller.groups[0].nodes == ["gpu-[1-64,70]", "trn-*"]


# A record as the controller before the step/action enums wrote it (main at 2202e84): words as plain strings,
# "" for the action before the first attempt. Records on disk must outlive an upgrade of the controller.
RECORD_OF_TODAY = {
    "acted_at": 1700000100.5,
    "action": "reboot",
    "attempt": 1,
    "boot_before": 1699990000,
    "detected_at": 1700000000.0,
    "forced_down": False,
    "history": [{"at": 1700000000.0, "from": "pending", "to": "acting", "why": "provider asked to reboot"}],
    "last_health": None,
    "node": "n7",
    "provider": "script",
    "reason": "Action:Reboot [hpr-agent] xid=79",
    "requested": "reboot",
    "rung": 0,
    "slurmd_before": 1699990010,
    "step": "waiting_back",
    "step_since": 1700000100.5,
    "why": "provider asked to reboot (attempt 1) via script",
}


def test_a_record_in_the_stored_format_of_before_the_enums_loads_and_is_written_back_the_same(tmp_path: Path) -> None:
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "n7.json").write_text(json.dumps(RECORD_OF_TODAY, sort_keys=True))
    (tmp_path / "nodes" / "n8.json").write_text(
        json.dumps({**RECORD_OF_TODAY, "node": "n8", "action": "", "step": "pending", "requested": "replace"})
    )
    store = StateStore(tmp_path)
    loaded = store.load_all()
    rec, fresh = loaded["n7"], loaded["n8"]
    assert rec.step is Step.WAITING_BACK and rec.requested is Action.REBOOT and rec.action is Action.REBOOT
    assert fresh.step is Step.PENDING and fresh.requested is Action.REPLACE and fresh.action is None
    assert fresh.current is Action.REPLACE
    store.save(rec)
    assert json.loads((tmp_path / "nodes" / "n7.json").read_text()) == RECORD_OF_TODAY
    assert fresh.to_json()["action"] == ""


@pytest.mark.parametrize(
    ("field", "word"), [("requested", "none"), ("requested", "reimage"), ("action", "none"), ("step", "dancing")]
)
def test_a_stored_record_with_a_word_not_ours_is_refused_naming_the_field(field: str, word: str) -> None:
    with pytest.raises(ValueError, match=f"unknown {field} '{word}'"):
        RepairRecord.from_json({**RECORD_OF_TODAY, field: word})


def test_every_step_is_either_driven_by_one_function_or_left_for_a_person() -> None:
    assert not set(STEP_FUNCTIONS) & FOR_A_PERSON
    assert set(STEP_FUNCTIONS) | FOR_A_PERSON == set(Step)


def test_a_ladder_rung_of_none_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"controller\.ladder.*not 'none'"):
        config_from_mapping({"controller": {"ladder": ["none", "replace"]}})
