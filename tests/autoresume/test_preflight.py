"""Preflight on a new node set (decide/preflight.py): the pure judgement, the settings, and that a relaunch onto
the same nodes (or the first attempt, or `preflight: off`) costs nothing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hpresilience.autoresume.decide.preflight import Preflight, judge
from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.config import config_from_mapping
from hpresilience.errors import ConfigError
from hpresilience.slurm.preflight import PreflightReport

S = AutoResumeSettings(preflight=True)


def report(**kw: Any) -> PreflightReport:
    rep = PreflightReport(joined={"n1": 0.0, "n2": 0.3, "n3": 0.3, "n4": 0.4}, allreduce_s=0.002, done=True)
    rep.transfer_mb = 4.0
    for k, v in kw.items():
        setattr(rep, k, v)
    return rep


def test_a_healthy_set_keeps_no_node_out() -> None:
    rep = report(transfer_s={"n2": 0.04, "n3": 0.05, "n4": 0.06})
    got = judge(rep, ["n1", "n2", "n3", "n4"], ["n3", "n4"], S)
    assert got.kept_out == {} and got.conclusive


def test_a_new_node_slower_than_the_floor_is_kept_out_even_alone() -> None:
    got = judge(report(transfer_s={"n3": 4.2}), ["n1", "n3"], ["n3"], S)
    assert list(got.kept_out) == ["n3"] and "MB/s" in got.kept_out["n3"]


def test_a_new_node_many_times_slower_than_the_others_is_kept_out() -> None:
    rep = report(transfer_s={"n2": 0.2, "n3": 0.2, "n4": 1.5})
    got = judge(rep, ["n1", "n2", "n3", "n4"], ["n4"], S)
    assert list(got.kept_out) == ["n4"] and "median" in got.kept_out["n4"]


def test_jitter_under_the_noise_floor_is_not_slow() -> None:
    rep = report(transfer_s={"n2": 0.01, "n3": 0.5})  # 50 x the median, but half a second: a busy host
    assert judge(rep, ["n1", "n2", "n3"], ["n3"], S).kept_out == {}


def test_an_old_node_is_never_kept_out_by_the_preflight() -> None:
    rep = report(transfer_s={"n2": 9.0, "n3": 0.05})
    assert judge(rep, ["n1", "n2", "n3"], ["n3"], S).kept_out == {}


def test_a_node_that_did_not_join_or_could_not_start_is_kept_out_and_the_others_are_not_blamed() -> None:
    rep = PreflightReport(joined={"n1": 0.0, "n2": 0.2}, missing=["n3"], errors={"n2": "RuntimeError: reset"})
    got = judge(rep, ["n1", "n2", "n3"], ["n2", "n3"], S)
    assert list(got.kept_out) == ["n3"] and "did not join" in got.kept_out["n3"]
    rep = PreflightReport(srun_failed=["n4"], timed_out=True)
    assert list(judge(rep, ["n1", "n4"], ["n4"], S).kept_out) == ["n4"]


def test_a_transfer_cut_by_the_bound_keeps_the_node_out() -> None:
    rep = report(transfer_s={"n2": 0.05}, slow={"n3": 19.8})
    got = judge(rep, ["n1", "n2", "n3"], ["n3"], S)
    assert "did not finish" in got.kept_out["n3"]


def test_no_word_from_the_hub_is_inconclusive_and_keeps_no_one_out() -> None:
    got = judge(PreflightReport(timed_out=True), ["n1", "n3"], ["n3"], S)
    assert got.kept_out == {} and not got.conclusive


def test_preflight_is_off_by_default_takes_on_off_and_names_an_unknown_key() -> None:
    # Off by default: it costs every relaunch onto a spare ~2 s, and that path must stay the fast one.
    assert AutoResumeSettings().preflight is False
    assert AutoResumeSettings.model_validate({"preflight": "off"}).preflight is False
    assert AutoResumeSettings.model_validate({"preflight": "on"}).preflight is True
    assert S.preflight and S.preflight_timeout_s == 20.0
    with pytest.raises(ValidationError, match="preflight_timeout"):
        AutoResumeSettings.model_validate({"preflight_timeout": 5})
    with pytest.raises(ValidationError):
        AutoResumeSettings.model_validate({"preflight_timeout_s": 0})
    with pytest.raises(ValidationError):
        AutoResumeSettings.model_validate({"preflight_slow_factor": 1})


def test_preflight_keys_load_from_the_configuration_file() -> None:
    s = config_from_mapping({"autoresume": {"preflight": False, "preflight_mb": 8}})
    assert s.autoresume.preflight is False and s.autoresume.preflight_mb == 8
    with pytest.raises(ConfigError, match="preflight_bound_s"):
        config_from_mapping({"autoresume": {"preflight_bound_s": 8}})


class NoSlurm:
    """A client that must not be used: any attribute read fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the preflight touched Slurm ({name}) although nothing called for it")


def preflight(tmp_path: Path, **settings: Any) -> tuple[Preflight, Path]:
    store = WrapperStateStore(tmp_path, 7)
    opts = WrapperOptions(
        job_id=7, srun=None, srun_bin="srun", run_policy=S.run_policy, state_dir=tmp_path,  # type: ignore[arg-type]
        watch=AutoResumeSettings.model_validate({"preflight": True, **settings}),
    )  # fmt: skip

    def recover(bad: Sequence[str], plan: Sequence[str], size: int) -> list[str]:
        raise AssertionError("nothing to recover")

    return Preflight(NoSlurm(), 7, opts, Reporter(store, 7, None), {}, recover), store.events_path  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("plan", "previous", "settings"),
    [
        (["n1", "n2"], ["n2", "n1"], {}),  # the same nodes (in any order)
        (["n1", "n2"], None, {}),  # the first attempt: no node known good to be the hub
        (["n1", "n3"], ["n1", "n2"], {"preflight": "off"}),
        (["n3", "n4"], ["n1", "n2"], {}),  # no node of the previous attempt left to be the hub
    ],
)
def test_no_check_runs_when_nothing_calls_for_one(
    tmp_path: Path, plan: list[str], previous: list[str] | None, settings: dict[str, Any]
) -> None:
    pf, events = preflight(tmp_path, **settings)
    assert pf.vet(plan, previous, 2) == plan
    assert pf.checks == 0
    assert not events.exists() or not [json.loads(x) for x in events.read_text().splitlines()]


class OneNode:
    """A client that answers the hub's address, and nothing else."""

    def node(self, name: str) -> Any:
        return type("N", (), {"name": name, "address": f"10.0.0.{name[-1]}"})()


def test_a_node_kept_out_is_replaced_through_recover_and_the_new_set_checked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = {
        "n1,n3": report(transfer_s={"n3": 6.0}),  # 0.7 MB/s: kept out
        "n1,n4": report(transfer_s={"n4": 0.03}),
    }
    seen: list[str] = []

    def fake_run(client: Any, job_id: int, nodes: list[str], *args: Any, **kw: Any) -> PreflightReport:
        seen.append(",".join(nodes))
        return reports[",".join(nodes)]

    monkeypatch.setattr("hpresilience.autoresume.decide.preflight.run_preflight", fake_run)
    pf, events = preflight(tmp_path)
    recovered: list[list[str]] = []

    def recover(bad: Sequence[str], plan: Sequence[str], size: int) -> list[str]:
        recovered.append(list(bad))
        return ["n1", "n4"]

    pf.client, pf.recover = OneNode(), recover  # type: ignore[assignment]
    assert pf.vet(["n1", "n3"], ["n1", "n2"], 2) == ["n1", "n4"]
    assert seen == ["n1,n3", "n1,n4"] and recovered == [["n3"]]
    names = [json.loads(x)["event"] for x in events.read_text().splitlines()]
    assert names == ["preflight_node_kept_out", "preflight_passed"]
    kept = json.loads(events.read_text().splitlines()[0])
    assert kept["node"] == "n3" and kept["hub"] == "n1" and kept["transfer_s"] == {"n3": 6.0}


def test_the_rounds_are_bounded_and_a_silent_hub_lets_the_step_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def always_slow(client: Any, job_id: int, nodes: list[str], *args: Any, **kw: Any) -> PreflightReport:
        calls.append(",".join(nodes))
        return report(transfer_s={nodes[1]: 9.0})

    monkeypatch.setattr("hpresilience.autoresume.decide.preflight.run_preflight", always_slow)
    pf, _ = preflight(tmp_path, preflight_rounds=2)
    spares = iter(["n4", "n5", "n6"])
    pf.client = OneNode()  # type: ignore[assignment]
    pf.recover = lambda bad, plan, size: ["n1", next(spares)]
    assert pf.vet(["n1", "n3"], ["n1", "n2"], 2) == ["n1", "n5"]  # checked twice, then launched as it stands
    assert calls == ["n1,n3", "n1,n4"]
    assert json.loads(pf.reporter.store.events_path.read_text().splitlines()[-1])["event"] == "preflight_rounds_spent"
    monkeypatch.setattr(
        "hpresilience.autoresume.decide.preflight.run_preflight", lambda *a, **k: PreflightReport(timed_out=True)
    )
    pf2, events = preflight(tmp_path / "2")
    pf2.client = OneNode()  # type: ignore[assignment]
    assert pf2.vet(["n1", "n3"], ["n1", "n2"], 2) == ["n1", "n3"]
    assert [json.loads(x)["event"] for x in events.read_text().splitlines()] == ["preflight_inconclusive"]
