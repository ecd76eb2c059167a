"""Integration: a node repaired `lemon_repairs` times within `lemon_window_s` is left drained for a person."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from hpresilience.cli import cli
from hpresilience.controller.loop import Controller
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.controller.conftest import Scripts, history, settings_for, wait_until

pytestmark = pytest.mark.integration


def earlier_repairs(state: Path, node: str, ages_s: list[float]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "history.jsonl", "a") as f:
        for age in ages_s:
            f.write(
                json.dumps(
                    {
                        "node": node,
                        "outcome": "repaired",
                        "at": time.time() - age,
                        "requested": "reboot",
                        "provider": "script",
                        "attempts": 1,
                    }
                )
                + "\n"
            )


def test_third_repair_within_the_window_leaves_the_node_drained_for_a_person(
    cluster: DevCluster,
    slurm: SlurmClient,
    scripts: Scripts,
    tmp_path: Path,
    start_controller: Callable[[Controller], Controller],
) -> None:
    """Two repairs of n2 in the last week (and one older, which does not count): the third passes its gate but
    n2 is not resumed; its reason starts `hpr: needs a person` and names the repairs; status and metrics say so.
    Once a person resumes it, the count starts afresh."""
    state = tmp_path / "state"
    earlier_repairs(state, "n2", [8 * 86400, 3 * 86400, 3600])
    registry = CollectorRegistry()
    ctl = start_controller(Controller(settings_for(scripts, state), slurm, registry=registry))
    slurm.set_node_state(["n2"], "fail", "Action:Reboot")
    rec = wait_until(lambda: r if (r := ctl.records.get("n2")) and r.step == "lemon" else None, "n2 to be a lemon")
    n2 = slurm.node("n2")
    assert n2.has("DRAIN") and n2.reason.startswith("hpr: needs a person: repaired 3 times within 7 d")
    assert n2.reason.count("reboot") == 3 and rec.step == "lemon" and scripts.gate_calls == ["n2"]
    time.sleep(1.0)  # a few more cycles: nothing picks the node up again
    assert slurm.node("n2").has("DRAIN") and scripts.calls == ["n2 reboot"]
    assert registry.get_sample_value("hpr_controller_nodes", {"step": "lemon"}) == 1
    assert (
        registry.get_sample_value(
            "hpr_controller_repairs_total", {"provider": "script", "action": "reboot", "outcome": "lemon"}
        )
        == 1
    )
    out = CliRunner().invoke(cli, ["--json", "status", "--state-dir", str(state)])
    assert out.exit_code == 0, out.output
    [shown] = json.loads(out.output)["under_repair"]
    assert shown["node"] == "n2" and shown["step"] == "lemon" and "needs a person" in shown["why"]

    slurm.set_node_state(["n2"], "resume")  # a person fixed it
    wait_until(lambda: any(h["outcome"] == "lemon_cleared" for h in history(state)), "the lemon to be cleared")
    slurm.set_node_state(["n2"], "fail", "Action:Reboot")
    wait_until(
        lambda: [
            h
            for h in history(state)
            if h["outcome"] == "repaired" and h.get("provider") == "script" and h["at"] > time.time() - 60
        ],
        "the next repair to resume n2",
    )
    assert slurm.node("n2").reason == ""
