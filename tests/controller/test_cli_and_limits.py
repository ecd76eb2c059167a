"""Integration: `hpresilience replace` / `status` / `controller --once --dry-run`, the concurrency cap, and a
provider that fails (Slurm's own reboot without a RebootProgram, as on the devcluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpresilience.cli import main
from hpresilience.controller.loop import Controller
from hpresilience.controller.state import RepairRecord, StateStore, Step
from hpresilience.reasons import Action
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.controller.conftest import Scripts, settings_for, wait_until, write_scripts

pytestmark = pytest.mark.integration


def cycled(ctl: Controller) -> bool:
    ctl.cycle()
    return True


@pytest.fixture()
def slurm_env(cluster: DevCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf_path))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"controller:\n  state_dir: {tmp_path / 'state'}\n  forced_down_after_s: 5\n")
    monkeypatch.setenv("HPRESILIENCE_CONFIG", str(cfg))
    return tmp_path / "state"


def test_replace_sets_the_action_reason_and_refuses_someone_elses(
    slurm_env: Path, slurm: SlurmClient, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replace", "n3", "--reboot"]) == 0
    n3 = slurm.node("n3")
    assert n3.has("FAIL") and n3.reason.startswith("Action:Reboot requested by ")
    slurm.set_node_state(["n4"], "drain", "maintenance window")
    assert main(["replace", "n4"]) == 2
    assert "someone else's reason ('maintenance window'); --force" in capsys.readouterr().err
    assert slurm.node("n4").reason == "maintenance window"
    assert main(["replace", "n4", "--force"]) == 0
    n4 = slurm.node("n4")
    assert n4.has("DOWN") and n4.reason.startswith("Action:Replace requested by ")


def test_replace_refuses_a_node_already_under_repair(slurm_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = RepairRecord(node="n2", requested=Action.REPLACE, reason="Action:Replace", provider="script", detected_at=1.0)
    rec.move(Step.WAITING_BACK, "provider returned")
    StateStore(slurm_env).save(rec)
    assert main(["replace", "n2"]) == 2
    assert "already under repair (step waiting_back)" in capsys.readouterr().err


def test_status_shows_step_since_and_last_health(slurm_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = StateStore(slurm_env)
    rec = RepairRecord(
        node="n2",
        requested=Action.REBOOT,
        reason="Action:Reboot",
        provider="script",
        detected_at=1.0,
        attempt=2,
        action=Action.REPLACE,
        last_health={"passed": False, "detail": "exit 1", "at": 5.0},
    )
    rec.move(Step.GATING, "slurmd registered again")
    store.save(rec)
    done = RepairRecord(node="n1", requested=Action.REPLACE, reason="", provider="ec2", detected_at=1.0, why="resumed")
    store.finish(done, "repaired")
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "n2" in out and "gating" in out and "fail" in out and "slurmd registered again" in out
    assert "n1" in out and "repaired" in out
    assert main(["--json", "status"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in data["under_repair"]] == ["gating"]
    assert data["history"][0]["outcome"] == "repaired"


def test_dry_run_once_logs_the_decision_and_changes_nothing(
    slurm_env: Path, slurm: SlurmClient, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm.set_node_state(["n3"], "fail", "Action:Replace")
    assert main(["controller", "--once", "--dry-run", "--state-dir", str(slurm_env)]) == 0
    err = capsys.readouterr().err
    assert "repair_detected" in err and "repair_would_start" in err
    assert slurm.node("n3").reason == "Action:Replace" and not slurm_env.exists()


def test_concurrency_limit_keeps_the_second_node_waiting(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    scripts: Scripts = write_scripts(tmp_path / "scripts", cluster, provider_delay_s=1.5)
    ctl = Controller(settings_for(scripts, tmp_path / "state", max_concurrent=1), slurm)
    slurm.set_node_state(["n3", "n4"], "fail", "Action:Replace")
    ctl.cycle()
    ctl.cycle()
    steps = {n: r.step for n, r in ctl.records.items()}
    assert sorted(steps.values()) == ["acting", "pending"]
    waiting = next(n for n, s in steps.items() if s == "pending")
    assert ctl.records[waiting].why == "waiting for a repair slot"
    wait_until(lambda: cycled(ctl) and not ctl.records, "both repairs to finish", timeout=60)
    assert sorted(scripts.calls) == ["n3 replace", "n4 replace"]
    ctl.pool.shutdown()


def test_failing_provider_escalates_then_leaves_the_node_for_a_person(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """The devcluster has no RebootProgram, so `scontrol reboot` fails: each rung fails, the node stays out."""
    scripts = write_scripts(tmp_path / "scripts", cluster)
    ctl = Controller(
        settings_for(
            scripts, tmp_path / "state", default_provider="reboot", default_options={}, ladder=["reboot", "replace"]
        ),
        slurm,
    )
    slurm.set_node_state(["n4"], "fail", "Action:Reboot")
    wait_until(lambda: cycled(ctl) and ctl.records["n4"].step == "given_up", "n4 to be given up", timeout=60)
    n4 = slurm.node("n4")
    assert n4.has("DRAIN") and n4.reason.startswith("[hpr-controller] needs a person: gave up after 2 attempt(s)")
    assert "provider reboot failed" in n4.reason
    assert ctl.metrics.failures.labels("reboot", "reboot", "provider_error")._value.get() == 1
    assert ctl.metrics.failures.labels("reboot", "replace", "provider_error")._value.get() == 1
    # An operator resuming it ends the record.
    slurm.set_node_state(["n4"], "resume")
    ctl.cycle()
    assert ctl.records == {}
    ctl.pool.shutdown()
