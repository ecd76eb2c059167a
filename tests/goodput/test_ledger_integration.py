"""The goodput ledger against ground truth: HyperPod's documented recipe (examples/hyperpod, torchrun on gloo)
with known checkpoints and step times, two nodes marked Action:Replace while it trains, and what the test
itself saw in the job's output (when each step's line appeared, which checkpoint each attempt resumed from).
Then `hpresilience job` from another directory, and `hpresilience goodput` over the finished jobs."""

from __future__ import annotations

import itertools
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from hpresilience.goodput.ledgermetrics import LedgerCollector
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_recipe_integration import Recipe, job_notices

pytestmark = pytest.mark.integration

STEPS = 36
CKPT_EVERY = 12
STEP_SLEEP = "0.4"


class Watch:
    """Reads the job's output as it grows and notes when each line first appeared (wall clock)."""

    def __init__(self, run: Recipe) -> None:
        self.run = run
        self.lines: list[tuple[float, str]] = []

    def poll(self) -> None:
        now = time.time()
        lines = self.run.out.splitlines()
        if lines and not self.run.out.endswith("\n"):
            lines.pop()  # a line still being written
        self.lines.extend((now, ln) for ln in lines[len(self.lines) :])

    def until(self, pattern: str, timeout: float = 90.0, after: int = 0) -> tuple[float, re.Match[str]]:
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            for t, ln in self.lines[after:]:
                m = re.search(pattern, ln)
                if m:
                    return t, m
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {pattern!r}\n{self.run.out[-3000:]}")
            time.sleep(0.03)

    def steps(self) -> list[tuple[float, int]]:
        return [(t, int(m.group(1))) for t, ln in self.lines if (m := re.fullmatch(r"step=(\d+)", ln))]


def hpr(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpresilience", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def ledger_of(run: Recipe) -> dict[str, Any]:
    path = run.state / f"{run.job_id}.ledger.json"
    # A bound, not the expected time: under CI's load torchrun and torch's import alone took 47 s once.
    run.wait(lambda: path.exists() and json.loads(path.read_text())["ended"], "the final ledger", 240)
    return dict(json.loads(path.read_text()))


def test_ledger_matches_ground_truth_for_two_node_replacements_in_the_recipe(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Two faults (Action:Replace on the non-batch node, each time after some steps past a checkpoint): the
    ledger has one restart per fault naming the node, lost work within 25 % (or 1.5 s) of what the output
    shows was redone, productive time near the steps times the step time, and the categories plus the
    productive time sum to the wall time. `hpresilience job` finds it from another directory, and the
    wrapper printed the same summary into the job's output."""
    run = Recipe(
        cluster,
        tmp_path / "job",
        steps=STEPS,
        extra_env={"CKPT_EVERY": str(CKPT_EVERY), "TRAIN_STEP_SLEEP": STEP_SLEEP},
    )
    watch = Watch(run)
    faults: list[tuple[str, float]] = []
    after = 0
    with job_notices(slurm):  # the controller's job thread: the wrapper learns of a mark from its own job
        for target in (19, 31):  # 7 steps past checkpoint 12, then 7 past checkpoint 24
            watch.until(rf"^step={target}$", after=after)
            job = slurm.job(run.job_id)
            victim = next(n for n in job.nodes if n != job.batch_host)
            faults.append((victim, time.time()))
            slurm.set_node_state([victim], "fail", "Action:Replace")
            watch.until(r"^resumed from step (\d+)", after=after)
            after = len(watch.lines)
    watch.until(r"^training finished step=")
    ledger = ledger_of(run)

    # Ground truth from the output: the step time, and for each fault the moment its checkpoint was written.
    resumed = [int(x) for x in re.findall(r"resumed from step (\d+)", run.out)]
    assert len(resumed) == 2 and resumed[0] == CKPT_EVERY and resumed[1] > resumed[0], run.out
    seen = watch.steps()
    step_s = statistics.median(b[0] - a[0] for a, b in itertools.pairwise(seen) if b[1] == a[1] + 1)
    truths = []
    for (_, at), ckpt in zip(faults, resumed, strict=True):
        # Work since the checkpoint resumed from is lost; a checkpoint saved after the mark (the marked node
        # still trains until the wrapper stops it) loses nothing before the fault, only detection time.
        saved_at = max(t for t, s in seen if s == ckpt)
        truths.append(max(0.0, at - saved_at))

    restarts = ledger["restarts"]
    assert [r["nodes"] for r in restarts] == [[v] for v, _ in faults]
    assert [r["cause"] for r in restarts] == ["hardware", "hardware"]
    for r, truth in zip(restarts, truths, strict=True):
        assert r["lost_s"] is not None and abs(r["lost_s"] - truth) <= max(0.25 * truth, 1.5), (r, truths)
    parts = ledger["productive_s"] + sum(ledger["badput_s"].values())
    assert abs(parts - ledger["wall_s"]) <= 0.05 * ledger["wall_s"]
    assert abs(ledger["productive_s"] - STEPS * step_s) <= max(0.15 * STEPS * step_s, 1.5), (ledger, step_s)
    assert ledger["badput_s"]["reinit"] > 0 and ledger["badput_s"]["replacement"] > 0
    assert ledger["lost_work_known"] and 0 < ledger["goodput"] < 1

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = hpr(run.env, elsewhere, "job", str(run.job_id), "--json")
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert shown["job_id"] == run.job_id and shown["goodput"] == ledger["goodput"]
    assert shown["badput_s"] == ledger["badput_s"] and [r["nodes"] for r in shown["restarts"]] == [
        r["nodes"] for r in restarts
    ]
    text = hpr(run.env, elsewhere, "job", str(run.job_id)).stdout
    assert f"job {run.job_id}: goodput" in text and faults[0][0] in text
    assert f"[hpresilience] job {run.job_id}: goodput {ledger['goodput'] * 100:.1f} %" in run.out


def test_goodput_over_finished_jobs_is_the_sum_of_their_ledgers(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Two finished recipe jobs: `hpresilience goodput` lists both from slurmdbd with their ledgers' figures,
    and its totals, category by category, are the sums over the jobs it lists. (One after the other: the
    recipe's fixed master port would collide on the devcluster's one host.)"""
    runs, ledgers = [], {}
    for name, steps in (("a", 3), ("b", 8)):
        runs.append(Recipe(cluster, tmp_path / name, steps=steps, sbatch_args=("--nodes=1",)))
        ledgers[runs[-1].job_id] = ledger_of(runs[-1])
        assert ledgers[runs[-1].job_id]["lost_work_known"], runs[-1].out
    env = runs[0].env

    def listed() -> dict[str, Any] | None:
        res = hpr(env, tmp_path, "goodput", "--since", "1h", "--json")
        assert res.returncode == 0, res.stderr
        data: dict[str, Any] = json.loads(res.stdout)
        return data if {j["job_id"] for j in data["jobs"]} >= set(ledgers) else None

    data = runs[0].wait(listed, "slurmdbd to list both jobs", 60)
    by_id = {j["job_id"]: j for j in data["jobs"]}
    assert len(by_id) == len(data["jobs"])  # a resized job has several sacct records: counted once
    for job_id, ledger in ledgers.items():
        assert by_id[job_id]["productive_s"] == ledger["productive_s"]
        assert by_id[job_id]["wall_s"] == ledger["wall_s"]
        assert by_id[job_id]["badput_s"] == ledger["badput_s"]
    assert by_id[runs[1].job_id]["productive_s"] > by_id[runs[0].job_id]["productive_s"] > 0
    assert data["wall_s"] == pytest.approx(sum(j["wall_s"] for j in data["jobs"]), abs=0.01)
    assert data["productive_s"] == pytest.approx(sum(j["productive_s"] for j in data["jobs"]), abs=0.01)
    # The controller's collector: the same figures, labelled with the job and user slurmdbd reports.
    registry = CollectorRegistry()
    registry.register(LedgerCollector(slurm, refresh_s=0, wait_s=60))  # each scrape waits for its whole refresh
    for job_id, ledger in ledgers.items():
        who = {"job_id": str(job_id), "user": by_id[job_id]["user"], "partition": by_id[job_id]["partition"]}
        assert who["user"] and registry.get_sample_value("hpr_job_goodput_ratio", who) == pytest.approx(
            ledger["goodput"], abs=1e-3
        )
        assert registry.get_sample_value("hpr_job_badput_seconds", {**who, "category": "reinit"}) == pytest.approx(
            ledger["badput_s"]["reinit"], abs=1e-3
        )
    assert registry.get_sample_value("hpr_cluster_badput_seconds_total", {"category": "reinit"}) == pytest.approx(
        data["badput_s"]["reinit"], abs=0.01
    )
    for category, seconds in data["badput_s"].items():
        assert seconds == pytest.approx(sum(j["badput_s"][category] for j in data["jobs"]), abs=0.01)


def test_job_reads_the_ledger_in_a_training_environment_without_the_node_extra(
    cluster: DevCluster, tmp_path: Path
) -> None:
    """Issue 32: with `hpresilience[torch]` only (no re2, psutil, hostlist, boto3, prometheus_client),
    `hpresilience job JOBID` finds the finished job through Slurm and prints its ledger."""
    from tests.commands.test_training_env import hpr_without_node_extra

    run = Recipe(cluster, tmp_path / "job", steps=3, sbatch_args=("--nodes=1",))
    ledger = ledger_of(run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = hpr_without_node_extra("job", str(run.job_id), "--json", env=run.env, cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert shown["job_id"] == run.job_id and shown["goodput"] == ledger["goodput"]
