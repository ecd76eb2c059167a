"""The controller's repair steps as values (controller/steps.py): a step writes nothing and says what to do; the
loop's `apply` carries it out, writes first, so that a write Slurm refuses leaves the record as it was."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpresilience.controller.gates import Gate, GateResult
from hpresilience.controller.loop import Controller
from hpresilience.controller.providers import Provider
from hpresilience.controller.selection import look
from hpresilience.controller.settings import ControllerSettings
from hpresilience.controller.state import RepairRecord, Step
from hpresilience.controller.steps import Finish, Gated, Move, Note, Returned, Start, gating, pending, triage
from hpresilience.reasons import Action, controller_reason
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.testing.fakerunner import FakeRunner

SETTINGS = ControllerSettings.model_validate({"state_dir": "/nonexistent", "metrics_address": ""})


@dataclass
class Repairs:
    """The controller as the steps see it (steps.Repairs), without Slurm or threads."""

    settings: ControllerSettings = SETTINGS
    gate: Gate = field(default_factory=lambda: _Gate())
    active: int = 0
    earlier: list[dict[str, Any]] = field(default_factory=list)

    def active_repairs(self) -> int:
        return self.active

    def provider_for(self, node: str) -> Provider:
        return _Provider()

    def come_back_timeout(self, node: str) -> float:
        return self.settings.come_back_timeout_s

    def repairs_since(self, node: str, since: float) -> list[dict[str, Any]]:
        return self.earlier


class _Gate:
    name = "toy"

    def check(self, node: Node) -> GateResult:
        return GateResult(True, "ok", 0.0, 0.0)


class _Provider:
    name = "toy"

    def act(self, node: Node, action: Action) -> str:
        return f"{action} {node.name}"


def node(states: str, reason: str, **kw: Any) -> Node:
    return Node("n1", "", "", frozenset(states.split("+")), reason=reason, **kw)


def record(step: Step = Step.PENDING, **kw: Any) -> RepairRecord:
    rec = RepairRecord(node="n1", requested=Action.REPLACE, reason="Action:Replace", provider="reboot", detected_at=0.0)
    rec.step = step
    for k, v in kw.items():
        setattr(rec, k, v)
    return rec


def test_a_pending_step_on_a_free_node_drains_it_first_and_counts_the_attempt_only_once_drained() -> None:
    rec = record()
    t = pending(Repairs(), rec, look(node("IDLE+FAIL", "Action:Replace", slurmd_start_time=7), SETTINGS), None, 5.0)
    assert isinstance(t, Move) and t.step is Step.ACTING and t.event == "repair_action_started"
    assert [state for state, _ in t.marks] == ["drain"] and t.marks[0][1].startswith("Action:Replace [hpr-controller]")
    assert rec.attempt == 0 and rec.step is Step.PENDING  # nothing written by the step itself
    assert t.update is not None and t.start is not None
    t.update(rec)
    assert (rec.attempt, rec.slurmd_before, rec.acted_at) == (1, 7, 5.0)
    assert t.start() == "reboot n1"  # the ladder's first rung


def test_a_full_repair_slot_and_a_dry_run_say_so_once() -> None:
    busy = Repairs(active=SETTINGS.max_concurrent)
    idle = look(node("IDLE+FAIL", "Action:Replace"), SETTINGS)
    t = pending(busy, record(), idle, None, 1.0)
    assert isinstance(t, Move) and t.event == "repair_waiting_for_slot" and t.step is Step.PENDING
    assert pending(busy, record(why="waiting for a repair slot"), idle, None, 1.0) is None
    dry = Repairs(settings=SETTINGS.model_copy(update={"dry_run": True}))
    t = pending(dry, record(), idle, None, 1.0)
    assert isinstance(t, Note) and t.why == "would reboot (attempt 1) via reboot"
    assert pending(dry, record(why=t.why), idle, None, 1.0) is None


def test_a_gate_result_is_recorded_before_what_follows_it() -> None:
    ours = look(node("IDLE+DRAIN", controller_reason("repairing", Action.REPLACE)), SETTINGS)
    passed = Returned(GateResult(True, "fine", 0.1, 1.0))
    t = gating(Repairs(), record(Step.GATING), ours, passed, 2.0)
    assert (
        isinstance(t, Gated)
        and t.result.passed
        and t.then == Finish("repaired", "health gate passed (fine); resumed", resume=True)
    )
    lemon = gating(Repairs(earlier=[{"requested": "replace", "at": 0.0}] * 2), record(Step.GATING), ours, passed, 2.0)
    assert isinstance(lemon, Gated) and isinstance(lemon.then, Move) and lemon.then.step is Step.LEMON
    failed = gating(Repairs(), record(Step.GATING), ours, Returned(None, RuntimeError("boom")), 2.0)
    assert isinstance(failed, Gated) and not failed.result.passed and "gate error: boom" in failed.result.detail
    assert isinstance(failed.then, Move) and failed.then.failed == "gate_failed" and failed.then.step is Step.PENDING
    assert isinstance(gating(Repairs(), record(Step.GATING), ours, None, 2.0), Start)  # restarted mid-gate


def test_a_node_resumed_or_retitled_by_someone_else_ends_the_repair_whatever_its_step() -> None:
    assert triage(Repairs(), record(Step.WAITING_BACK), look(node("IDLE", ""), SETTINGS)) == Finish(
        "resumed_outside_controller", "node back in service without the controller (idle)"
    )
    t = triage(Repairs(), record(Step.WAITING_BACK), look(node("IDLE+DRAIN", "maintenance"), SETTINGS))
    assert isinstance(t, Finish) and t.outcome == "taken_over"
    assert triage(Repairs(), record(Step.GATING), look(node("IDLE", ""), SETTINGS)) is None  # the gate decides


def test_a_refused_forced_down_leaves_the_record_as_it_was_and_is_tried_again(tmp_path: Path) -> None:
    runner = FakeRunner().answer("scontrol", "update", exit_code=1, stderr="Invalid user for this operation")
    runner.answer("scontrol", "update")  # then accepted
    settings = ControllerSettings.model_validate(
        {"state_dir": str(tmp_path / "ctl"), "metrics_address": "", "forced_down_after_s": 10}
    )
    ctl = Controller(settings, SlurmClient(runner))
    busy = node("ALLOCATED+DRAIN", "Action:Replace")
    ctl.process([busy], 0.0)  # picked up
    ctl.process([busy], 1.0)  # waiting for its jobs
    assert ctl.records["n1"].why.startswith("waiting for its jobs")
    ctl.process([busy], 20.0)  # forced down: refused
    rec = ctl.records["n1"]
    assert not rec.forced_down and rec.why.startswith("waiting for its jobs")
    ctl.process([busy], 21.0)
    assert rec.forced_down and rec.why == "forced down after 21 s waiting for its jobs"
    ctl.pool.shutdown()
