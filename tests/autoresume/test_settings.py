"""AutoResumeSettings: a pasted HyperPod runPolicy loads unchanged; every mistake names the rule and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpresilience.autoresume.settings import AutoResumeSettings, RunPolicySettings, load_rules_file
from hpresilience.config import config_as_dict, config_from_mapping
from hpresilience.errors import ConfigError

# The runPolicy block of AWS's HyperPodPyTorchJob example, as published (docs: sagemaker-eks-operator-usage).
HYPERPOD_BLOCK = r"""
runPolicy:
  jobMaxRetryCount: 50
  restartPolicy:
    numRestartBeforeFullJobRestart: 3
    evalPeriodSeconds: 21600
    maxFullJobRestarts: 1
  cleanPodPolicy: "All"
  logMonitoringConfiguration:
    - name: "JobStart"
      logPattern: ".*Experiment configuration.*" # This is the start of the training script
      expectedStartCutOffInSeconds: 120 # Expected match in the first 2 minutes
    - name: "JobHangingDetection"
      logPattern: ".*\\[Epoch 0 Batch \\d+.*'training_loss_step': (\\d+(\\.\\d+)?).*"
      expectedRecurringFrequencyInSeconds: 300
      expectedStartCutOffInSeconds: 600
    - name: "NoS3CheckpointingDetection"
      logPattern: ".*The checkpoint is finalized. All shards is written.*"
      expectedRecurringFrequencyInSeconds: 600
      expectedStartCutOffInSeconds: 1800
    - name: "LowThroughputDetection"
      logPattern: ".*\\[Epoch 0 Batch \\d+.*'samples\\/sec': (\\d+(\\.\\d+)?).*"
      metricThreshold: 80
      operator: "lteq"
      metricEvaluationDataPoints: 25
"""


def _autoresume(block: str) -> AutoResumeSettings:
    return config_from_mapping({"autoresume": yaml.safe_load(block)}, "c.yaml").autoresume


def test_pasted_hyperpod_run_policy_loads_unchanged() -> None:
    rp = _autoresume(HYPERPOD_BLOCK).run_policy
    assert rp.job_max_retry_count == 50
    assert rp.restart_policy.num_restart_before_full_job_restart == 3
    assert rp.restart_policy.eval_period_seconds == 21600
    assert rp.restart_policy.max_full_job_restarts == 1
    names = [r.name for r in rp.log_monitoring_configuration]
    assert names == ["JobStart", "JobHangingDetection", "NoS3CheckpointingDetection", "LowThroughputDetection"]
    slow = rp.log_monitoring_configuration[3]
    assert (slow.metric_threshold, slow.operator, slow.data_points) == (80, "lteq", 25)
    assert rp.log_monitoring_configuration[1].expected_recurring_frequency_s == 300


def test_dump_round_trips_with_hyperpod_key_names() -> None:
    cfg = config_from_mapping({"autoresume": yaml.safe_load(HYPERPOD_BLOCK)})
    dumped = config_as_dict(cfg)["autoresume"]
    assert dumped["runPolicy"]["restartPolicy"]["numRestartBeforeFullJobRestart"] == 3
    assert config_from_mapping(config_as_dict(cfg)) == cfg


def test_defaults_work_without_any_policy() -> None:
    s = AutoResumeSettings()
    assert s.run_policy.log_monitoring_configuration == [] and s.run_policy.retry_on_application_error is False
    assert s.shutdown_signal == "SIGTERM" and s.fallback_when_no_replacement == "requeue"


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            {"name": "R", "logPattern": "(", "expectedStartCutOffInSeconds": 5},
            "rule 'R': logPattern is not a valid regular expression",
        ),
        (
            {"name": "R", "logPattern": "x", "stopPattern": "[", "expectedStartCutOffInSeconds": 5},
            "rule 'R': stopPattern is not a valid regular expression",
        ),
        (
            {"name": "R", "logPattern": "loss (\\d+)", "metricThreshold": 1},
            "rule 'R': metricThreshold and operator must be given together",
        ),
        (
            {"name": "R", "logPattern": "loss \\d+", "metricThreshold": 1, "operator": "gt"},
            "rule 'R': metricThreshold needs a capture group",
        ),
        (
            {"name": "R", "logPattern": "x", "expectedStartCutOffInSeconds": 5, "metricEvaluationDataPoints": 3},
            "rule 'R': metricEvaluationDataPoints needs metricThreshold",
        ),
        ({"name": "R", "logPattern": "x"}, "rule 'R' checks nothing"),
    ],
)
def test_bad_rule_is_rejected_naming_the_rule(rule: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"autoresume": {"runPolicy": {"logMonitoringConfiguration": [rule]}}}, "c.yaml")
    assert expected in str(err.value)
    assert "c.yaml: autoresume.runPolicy.logMonitoringConfiguration[0]" in str(err.value)


def test_unknown_key_and_bad_operator_name_their_key_path() -> None:
    rules = [
        {"name": "A", "logPattern": "x", "expectedStartCutOffInSeconds": 5},
        {"name": "B", "logPattern": "(\\d)", "metricThreshold": 1, "operator": "gte", "bogusKey": 1},
    ]
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"autoresume": {"runPolicy": {"logMonitoringConfiguration": rules}}}, "c.yaml")
    text = str(err.value)
    assert "c.yaml: autoresume.runPolicy.logMonitoringConfiguration[1].bogusKey: unknown key" in text
    assert "logMonitoringConfiguration[1].operator" in text


def test_duplicate_rule_names_are_rejected() -> None:
    rule = {"name": "A", "logPattern": "x", "expectedStartCutOffInSeconds": 5}
    with pytest.raises(ConfigError, match="rule name 'A' is used twice"):
        config_from_mapping({"autoresume": {"runPolicy": {"logMonitoringConfiguration": [rule, rule]}}})


def test_unknown_policy_key_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"autoresume\.runPolicy\.restartPolicy\.maxFullRestarts: unknown key"):
        config_from_mapping({"autoresume": {"runPolicy": {"restartPolicy": {"maxFullRestarts": 1}}}})


def test_our_extensions_are_validated() -> None:
    s = _autoresume("runPolicy: {retryOnApplicationError: 2, noRetryExitCodes: [93]}\nshutdown_signal: int\n")
    assert s.run_policy.retry_on_application_error == 2 and s.run_policy.no_retry_exit_codes == [93]
    assert s.shutdown_signal == "SIGINT"
    assert _autoresume("shutdown_signal: '15'").shutdown_signal == "SIGTERM"
    with pytest.raises(ConfigError, match="shutdown_signal"):
        _autoresume("shutdown_signal: SIGNOPE")
    with pytest.raises(ConfigError, match="retryOnApplicationError"):
        _autoresume("runPolicy: {retryOnApplicationError: -1}")
    with pytest.raises(ConfigError, match="fallback_when_no_replacement"):
        _autoresume("fallback_when_no_replacement: retry")


RULE_LIST = """
- name: Hang
  logPattern: ".*step \\\\d+.*"
  expectedRecurringFrequencyInSeconds: 60
"""


def test_rules_file_as_list_replaces_only_the_rules(tmp_path: Path) -> None:
    f = tmp_path / "rules.yaml"
    f.write_text(RULE_LIST)
    base = RunPolicySettings(jobMaxRetryCount=7)
    rp = load_rules_file(f, base)
    assert rp.job_max_retry_count == 7 and [r.name for r in rp.log_monitoring_configuration] == ["Hang"]
    f.write_text("logMonitoringConfiguration:" + RULE_LIST.replace("\n", "\n  "))
    rp = load_rules_file(f, base)
    assert rp.job_max_retry_count == 7 and [r.name for r in rp.log_monitoring_configuration] == ["Hang"]


def test_rules_file_with_run_policy_or_job_spec_replaces_the_policy(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(HYPERPOD_BLOCK)
    assert load_rules_file(f).job_max_retry_count == 50
    f.write_text("spec:\n  nprocPerNode: '8'\n" + HYPERPOD_BLOCK.replace("\n", "\n  "))
    with pytest.raises(ConfigError, match="nprocPerNode"):
        load_rules_file(f)  # a whole spec has other keys: refused rather than half-read
    f.write_text("spec:" + HYPERPOD_BLOCK.replace("\n", "\n  "))
    assert len(load_rules_file(f).log_monitoring_configuration) == 4


def test_rules_file_errors_name_file_rule_and_key(tmp_path: Path) -> None:
    f = tmp_path / "rules.yaml"
    f.write_text("- name: X\n  logPattern: '(unclosed'\n  expectedStartCutOffInSeconds: 5\n")
    with pytest.raises(ConfigError) as err:
        load_rules_file(f)
    assert str(err.value).startswith(f"{f}: [0]: ") and "rule 'X': logPattern" in str(err.value)
    f.write_text("- name: X\n  logPatern: 'a'\n")
    with pytest.raises(ConfigError, match=r"\[0\]\.logPatern: unknown key"):
        load_rules_file(f)
    f.write_text("rules: []\n")
    with pytest.raises(ConfigError, match="expected a list of rules"):
        load_rules_file(f)
    f.write_text("- [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_rules_file(f)
    with pytest.raises(ConfigError, match="cannot read rules file"):
        load_rules_file(tmp_path / "missing.yaml")


def test_hyperpod_documented_block_compiles_on_re2(tmp_path: Path) -> None:
    """Issue 14 item 6: the rule engine moved to RE2; AWS's published rules must still load and match."""
    from hpresilience.autoresume.watch.rules import RuleSet

    rp = _autoresume(HYPERPOD_BLOCK).run_policy
    rules = RuleSet(rp.log_monitoring_configuration)
    rules.feed("[Epoch 0 Batch 7 Global step 7] {'training_loss_step': 1.5, 'samples/sec': 12.5}", 1.0)
    assert rules.states()["JobHangingDetection"].value == "HEALTHY"


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(a)\\1", "invalid escape sequence"),  # backreference
        ("(?=loss).*", "invalid perl operator"),  # lookahead
        ("(?<!x)loss", "invalid perl operator"),  # lookbehind
        ("x{1001}", "invalid repetition size"),
    ],
)
def test_patterns_re2_cannot_run_are_refused_naming_the_rule(pattern: str, why: str) -> None:
    """Issue 14 item 6: refused at load with the rule's name, not accepted and run on a backtracking engine."""
    rule = {"name": "Bad", "logPattern": pattern, "expectedStartCutOffInSeconds": 5}
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"autoresume": {"runPolicy": {"logMonitoringConfiguration": [rule]}}}, "c.yaml")
    assert "rule 'Bad': logPattern is not a valid regular expression" in str(err.value) and why in str(err.value)


def test_catastrophic_pattern_loads_because_re2_runs_it_in_linear_time() -> None:
    rule = {"name": "Evil", "logPattern": "(a+)+$", "faultOnMatch": True}
    rp = RunPolicySettings.model_validate({"logMonitoringConfiguration": [rule]})
    assert rp.log_monitoring_configuration[0].name == "Evil"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("metricThreshold", float("nan")),
        ("expectedRecurringFrequencyInSeconds", float("inf")),
        ("expectedStartCutOffInSeconds", 1e12),
    ],
)
def test_nan_threshold_and_infinite_timers_are_refused(key: str, value: float) -> None:
    """Issue 14 item 8: a NaN threshold never compares true; an infinite frequency never fires."""
    rule = {
        "name": "R",
        "logPattern": ".*loss (\\d+).*",
        "operator": "gt",
        "metricThreshold": 1.0,
        "expectedStartCutOffInSeconds": 60,
        key: value,
    }
    with pytest.raises(ConfigError, match=rf"logMonitoringConfiguration\[0\]\.{key}"):
        config_from_mapping({"autoresume": {"runPolicy": {"logMonitoringConfiguration": [rule]}}}, "c.yaml")


def test_run_policy_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    """Issue 14 item 10: `runPolicy: []` silently became the defaults."""
    f = tmp_path / "rules.yaml"
    f.write_text("runPolicy: []\n")
    with pytest.raises(ConfigError, match=r"rules.yaml: runPolicy: must be a mapping, got list"):
        load_rules_file(f)
    f.write_text("runPolicy:\n")
    assert load_rules_file(f) == RunPolicySettings()  # an empty block is the defaults, as YAML reads it


def test_duplicate_rule_names_in_a_rules_list_file_are_refused(tmp_path: Path) -> None:
    """Issue 14 item 10: the list shape skipped the uniqueness check the mapping shapes had."""
    f = tmp_path / "rules.yaml"
    f.write_text(RULE_LIST + RULE_LIST.lstrip("\n"))
    with pytest.raises(ConfigError, match="rule name 'Hang' is used twice"):
        load_rules_file(f)


def test_a_bare_off_for_the_standby_in_yaml_means_off_and_a_bare_on_is_refused() -> None:
    """YAML reads `standby: off` as false; what the user wrote is the setting's "off"."""
    assert AutoResumeSettings.model_validate(yaml.safe_load("standby: off")).standby == "off"
    with pytest.raises(ValueError, match="standby"):
        AutoResumeSettings.model_validate(yaml.safe_load("standby: on"))
