"""deploy/: the Prometheus alert rules and the Grafana dashboard against the metrics the code exports.

promtool (Debian's `prometheus` package) checks the rules and the real /metrics output; every metric the
rules or the dashboard name must exist in a registry of the agent, the controller or the wrapper, so a
renamed metric fails here instead of leaving an empty panel or an alert that never fires."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from hpresilience.agent.marking import AgentMetrics
from hpresilience.autoresume.report import Reporter
from hpresilience.controller.metrics import ControllerMetrics
from hpresilience.goodput.ledger import Badput, Ledger
from hpresilience.goodput.ledgermetrics import LedgerCollector, _Seen
from hpresilience.metrics import MetricsServer
from hpresilience.slurm.accounting import JobRecord
from hpresilience.slurm.client import SlurmClient

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "hpresilience-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "hpresilience-dashboard.json"
SCRAPE = REPO / "deploy" / "prometheus" / "prometheus-scrape.yml"
METRIC = re.compile(r"\bhpr_[a-z0-9_]+\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("_sum", "_count", "_created"),
}


def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing (apt-get install -y prometheus); CI must check the rules")
        pytest.skip("promtool is missing (apt-get install -y prometheus)")
    return tool


class FakeStore:
    """The wrapper's Reporter only needs somewhere to append events; metrics are what is tested here."""

    events_path = Path("/dev/null")

    def append_event(self, record: object) -> None:
        return None


def ledger_registry() -> CollectorRegistry:
    """The controller's goodput collector, fed one job's ledger as slurmdbd would list it."""
    reg = CollectorRegistry()
    collector = LedgerCollector(SlurmClient(), refresh_s=1e9)
    collector.refreshed = time.time()
    ledger = Ledger(7, start=1.0, end=11.0, productive_s=8.0, attempts=1)
    ledger.add(Badput.REINIT, 2.0)
    collector.jobs[7] = _Seen(JobRecord(7, "alice", "gpu", "/home/alice"), ledger, 0.0)
    reg.register(collector)
    return reg


def registries() -> Iterator[CollectorRegistry]:
    agent = CollectorRegistry()
    a = AgentMetrics(agent)
    a.checks.labels("gpu_count", "fail").inc()
    a.duration.labels("gpu_count").observe(0.2)
    a.decisions.labels("mark", "Replace").inc()
    a.ceiling_holds.labels("Replace").inc()
    a.latency.observe(1.5)
    a.last_cycle.set(1.7e9)
    yield agent
    ctl = CollectorRegistry()
    c = ControllerMetrics(ctl)
    c.cluster_nodes.labels("fail", "agent").set(1)
    c.nodes.labels("acting").set(1)
    c.duration.labels("reboot", "Reboot").observe(300)
    c.failures.labels("reboot", "Reboot", "not_back").inc()
    c.outcomes.labels("reboot", "Reboot", "given_up").inc()
    c.gate.labels("pass").inc()
    c.poll.observe(0.1)
    yield ctl
    r = Reporter(FakeStore(), 7, None)  # type: ignore[arg-type]
    r.count_restart("hardware")
    r.observe_detection(2.0)
    r.observe_restart(8.0)
    r.set_attempts(2)
    yield r.registry
    yield ledger_registry()


def exported_names() -> set[str]:
    names: set[str] = set()
    for reg in registries():
        for fam in reg.collect():
            names |= {fam.name + s for s in SUFFIXES.get(fam.type, ("",))}
    return names


def named_in(texts: list[str]) -> set[str]:
    return {m for t in texts for m in METRIC.findall(t)}


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_promtool_accepts_the_rules() -> None:
    res = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_accepts_the_served_metrics() -> None:
    """The real /metrics bytes of each daemon's registry, as Prometheus would scrape them."""
    tool = promtool()
    for reg in registries():
        srv = MetricsServer(reg, "127.0.0.1:0").start()
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=5).read()
        finally:
            srv.stop()
        assert b"hpr_" in body
        res = subprocess.run([tool, "check", "metrics"], input=body, capture_output=True, timeout=60)
        assert res.returncode == 0, (res.stdout + res.stderr).decode()


def test_the_rules_alert_on_what_the_issue_asks() -> None:
    doc = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}
    assert 'outcome="given_up"' in alerts["HpresilienceNodeGivenUp"]
    assert "hpr_controller_repair_failures_total" in alerts["HpresilienceRepairFailureRate"]
    assert "hpr_agent_last_cycle_timestamp_seconds" in alerts["HpresilienceAgentNotCycling"]
    assert "hpr_job_restarts_total" in alerts["HpresilienceRestartStorm"]
    assert alerts["HpresilienceControllerAbsent"].startswith("absent(")
    assert 'step="lemon"' in alerts["HpresilienceNodeNeedsAPerson"]


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_named_is_exported(source: str) -> None:
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    named = named_in(exprs)
    assert named, f"no hpr_ metric found in the {source}"
    missing = named - exported_names()
    assert not missing, f"the {source} name metrics the code does not export: {sorted(missing)}"


def test_the_dashboard_covers_fleet_repairs_jobs_and_liveness() -> None:
    dash = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == ["Fleet health", "Repairs", "Jobs (srun --auto-resume)", "Liveness", "Where training time went"]
    named = named_in(dashboard_exprs())
    for metric in (
        "hpr_cluster_nodes",
        "hpr_agent_check_results_total",
        "hpr_controller_nodes",
        "hpr_controller_repair_duration_seconds_bucket",
        "hpr_controller_repairs_total",
        "hpr_autoresume_restarts_total",
        "hpr_autoresume_restart_latency_seconds_bucket",
        "hpr_agent_fault_detection_latency_seconds_bucket",
        "hpr_agent_last_cycle_timestamp_seconds",
        "hpr_cluster_badput_seconds_total",
        "hpr_job_goodput_ratio",
    ):
        assert metric in named, metric
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"]


def test_a_renamed_metric_is_caught() -> None:
    """The check itself: a dashboard expression with a name nothing exports is reported."""
    assert named_in(["rate(hpr_agent_check_result_total[5m])"]) - exported_names() == {"hpr_agent_check_result_total"}


# Labels Prometheus adds to every scraped series, and the bucket label of histograms.
TARGET_LABELS = {"instance", "job"}
SELECTOR = re.compile(r"\b(hpr_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def exported_labels() -> dict[str, set[str]]:
    """Per exported series name (with its _total/_bucket/... suffix), the label names the code gives it."""
    out: dict[str, set[str]] = {}
    for reg in registries():
        for fam in reg.collect():
            for sample in fam.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
    return out


def label_problems(expr: str, legend: str = "") -> list[str]:
    """Label names an expression (and its legend) uses that the metrics it reads do not carry."""
    labels = exported_labels()
    problems = []
    metrics = set(METRIC.findall(expr))
    carried = set().union(*(labels.get(m, set()) for m in metrics)) | TARGET_LABELS
    for metric, body in SELECTOR.findall(expr):
        for name in MATCHER.findall(body):
            if name not in labels.get(metric, set()) | TARGET_LABELS:
                problems.append(f"{metric}{{{name}}} in {expr!r}")
    groups = [set(w.strip() for w in g.split(",") if w.strip()) for g in BY.findall(expr)]
    for g in groups:
        problems += [f"by ({name}) in {expr!r}" for name in g - carried]
    # A legend can show only what the outermost aggregation keeps (or any label when there is none).
    shown = (
        groups[0] | TARGET_LABELS
        if groups and expr.lstrip().startswith(("sum", "max", "min", "avg", "count"))
        else carried
    )
    problems += [f"legend {{{{{name}}}}} of {expr!r}" for name in LEGEND.findall(legend) if name not in shown]
    return problems


def test_the_dashboards_metric_and_label_names_are_what_the_code_exports() -> None:
    dash = json.loads(DASHBOARD.read_text())
    problems = [
        p
        for panel in dash["panels"]
        for t in panel.get("targets", [])
        for p in label_problems(t["expr"], t.get("legendFormat", ""))
    ]
    assert not problems, problems


def test_the_rules_label_names_are_what_the_code_exports() -> None:
    problems = [p for e in rule_exprs() for p in label_problems(e)]
    assert not problems, problems


def test_a_renamed_label_is_caught() -> None:
    """The check itself: a selector, a grouping or a legend naming a label the metric lacks is reported."""
    assert label_problems('sum(hpr_agent_decisions_total{decison="mark"})')
    assert label_problems("sum by (kind) (hpr_controller_repairs_total)")
    assert label_problems("sum by (step) (hpr_controller_nodes)", "{{outcome}}")
    assert not label_problems("sum by (step) (hpr_controller_nodes)", "{{step}}")


def test_promtool_accepts_the_scrape_example_and_its_jobs_are_those_the_rules_name() -> None:
    res = subprocess.run([promtool(), "check", "config", str(SCRAPE)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    jobs = {j["job_name"] for j in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}
    named = {m for e in rule_exprs() for m in re.findall(r'job="([^"]+)"', e)}
    assert named == {"hpresilience-agent", "hpresilience-controller"} and named <= jobs


def test_promtool_fires_the_down_absent_and_ceiling_alerts(tmp_path: Path) -> None:
    """promtool's rule tests: the agent's scrape failing, the controller's series disappearing (absent), and
    a held mark each fire their alert; a controller that is there fires none. (The rules are tested without
    their annotations, which promtool would otherwise compare word for word.)"""
    doc = yaml.safe_load(RULES.read_text())
    for g in doc["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(doc))
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'up{job="hpresilience-agent",instance="n1:9761"}', "values": "0x10"},
                    {
                        "series": 'hpr_controller_last_cycle_timestamp_seconds{job="hpresilience-controller",'
                        'instance="head:9760"}',
                        "values": "1 2 3 _x20",
                    },
                    {
                        "series": 'hpr_agent_ceiling_holds_total{job="hpresilience-agent",'
                        'instance="n1:9761",action="Reboot"}',
                        "values": "0 0 1 1 1",
                    },
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "8m",
                        "alertname": "HpresilienceAgentDown",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "warning", "job": "hpresilience-agent", "instance": "n1:9761"}}
                        ],
                    },
                    {"eval_time": "2m", "alertname": "HpresilienceControllerAbsent", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "HpresilienceControllerAbsent",
                        "exp_alerts": [{"exp_labels": {"severity": "critical", "job": "hpresilience-controller"}}],
                    },
                    {
                        "eval_time": "4m",
                        "alertname": "HpresilienceFleetCeilingReached",
                        "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "rules_test.yml"
    path.write_text(yaml.safe_dump(tests))
    res = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


PROJECT_JOBS = {"hpresilience-agent", "hpresilience-controller"}


def test_every_series_a_rule_reads_is_selected_by_one_of_the_projects_scrape_jobs() -> None:
    """A rule reading a metric name alone would take it from any scrape: node_exporter's textfile directory
    (which sites used to make writable by their users), any exporter."""
    unselected = [
        f"{name} in {expr!r}"
        for expr in rule_exprs()
        for name, body in re.findall(r"\b(hpr_[a-z0-9_]+)(\{[^}]*\})?", expr)
        if not set(re.findall(r'\bjob="([^"]+)"', body)) & PROJECT_JOBS
    ]
    assert not unselected, unselected


def _rules_without_annotations(tmp_path: Path) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    for g in doc["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(doc))
    return rules


def _alert_series(job: str, instance: str) -> list[dict[str, str]]:
    """What each alert of issue 31 reads, at values that fire it: a lemon node, an agent stopped since the
    epoch, a repair given up, a ceiling hold and a job restarting every minute."""
    at = f'job="{job}",instance="{instance}"'
    return [
        {"series": f'hpr_controller_nodes{{{at},step="lemon"}}', "values": "1x40"},
        {"series": f"hpr_agent_last_cycle_timestamp_seconds{{{at}}}", "values": "0x40"},
        {
            "series": f'hpr_controller_repairs_total{{{at},provider="hyperpod",action="Replace",outcome="given_up"}}',
            "values": "0+1x40",
        },
        {"series": f'hpr_agent_ceiling_holds_total{{{at},action="Reboot"}}', "values": "0+1x40"},
        {"series": f'hpr_job_restarts_total{{{at},job_id="7",user="mallory",partition="gpu"}}', "values": "0+1x40"},
    ]


def test_promtool_a_lookalike_series_from_another_job_fires_no_alert(tmp_path: Path) -> None:
    """Issue 31, point 6: a user writing `hpr_controller_nodes{step="lemon"} 1` (and the others) into a
    textfile directory node_exporter serves (job "node") fires nothing; the same series from the project's
    own scrape jobs fire each alert (so the first half is not silent for another reason)."""
    healthy_controller = {
        "series": 'hpr_controller_last_cycle_timestamp_seconds{job="hpresilience-controller",instance="head:9760"}',
        "values": "0+60x40",  # a cycle a minute: the controller is there and cycling
    }
    names = [
        "HpresilienceNodeNeedsAPerson",
        "HpresilienceAgentNotCycling",
        "HpresilienceNodeGivenUp",
        "HpresilienceFleetCeilingReached",
        "HpresilienceRestartStorm",
        "HpresilienceRepairFailureRate",
        "HpresilienceControllerNotCycling",
    ]
    lookalike = {
        "interval": "1m",
        "input_series": [*_alert_series("node", "n1:9100"), healthy_controller],
        "alert_rule_test": [{"eval_time": "20m", "alertname": n, "exp_alerts": []} for n in names],
    }
    own_series = [
        *[s for s in _alert_series("hpresilience-agent", "n1:9761") if s["series"].startswith("hpr_agent")],
        *[s for s in _alert_series("hpresilience-controller", "head:9760") if not s["series"].startswith("hpr_agent")],
        healthy_controller,
    ]
    fired = {
        "HpresilienceNodeNeedsAPerson": [{"exp_labels": {"severity": "warning"}}],
        "HpresilienceAgentNotCycling": [
            {"exp_labels": {"severity": "warning", "job": "hpresilience-agent", "instance": "n1:9761"}}
        ],
        "HpresilienceNodeGivenUp": [
            {"exp_labels": {"severity": "critical", "provider": "hyperpod", "action": "Replace"}}
        ],
        "HpresilienceFleetCeilingReached": [{"exp_labels": {"severity": "critical"}}],
        "HpresilienceRestartStorm": [{"exp_labels": {"severity": "warning", "job_id": "7"}}],
    }
    own = {
        "interval": "1m",
        "input_series": own_series,
        "alert_rule_test": [{"eval_time": "20m", "alertname": n, "exp_alerts": e} for n, e in fired.items()],
    }
    path = tmp_path / "rules_test.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(_rules_without_annotations(tmp_path))],
                "evaluation_interval": "1m",
                "tests": [lookalike, own],
            }
        )
    )
    res = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
