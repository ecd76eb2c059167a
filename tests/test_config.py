"""Configuration: defaults with no file, one clear line per mistake naming file and key path."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hpresilience.config import Config, config_from_mapping, load_config
from hpresilience.errors import ConfigError
from hpresilience.settings_base import MAX_SECONDS


def test_defaults_work_without_any_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPRESILIENCE_CONFIG", raising=False)
    cfg = load_config(None)
    assert cfg == Config() and cfg.slurm.command_timeout_s == 30.0 and cfg.devcluster.nodes == 4


def test_values_are_read_and_frozen(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm:\n  command_timeout_s: 5\ndevcluster:\n  overrides: {SlurmdTimeout: '5'}\n")
    cfg = load_config(p)
    assert cfg.slurm.command_timeout_s == 5 and cfg.devcluster.overrides == {"SlurmdTimeout": "5"}
    with pytest.raises(ValidationError):
        cfg.slurm.command_timeout_s = 1  # type: ignore[misc]


def test_unknown_key_names_file_and_path(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm:\n  comand_timeout_s: 5\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert str(exc.value) == f"{p}: slurm.comand_timeout_s: unknown key"


def test_wrong_type_says_what_was_expected(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm:\n  retries: many\n")
    with pytest.raises(ConfigError, match=r"slurm\.retries: Input should be a valid integer"):
        load_config(p)


def test_garbage_yaml_gives_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm: [unclosed\n  : :\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+, column \d+"):
        load_config(p)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(p)


def test_missing_file_is_an_error_not_defaults(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(("section", "key", "value"), [
    ("slurm", "command_timeout_s", float("inf")),
    ("slurm", "command_timeout_s", 1e10),  # every Slurm call raised OverflowError past ~9.2e9
    ("agent", "passive_interval_s", float("inf")),  # one cycle, then none, while /healthz said healthy
    ("agent", "passive_interval_s", float("nan")),
    ("controller", "poll_interval_s", 1e300),
    ("autoresume", "replace_timeout_s", float("nan")),
    ("health", "escalation_window_s", float("-inf")),
])
def test_infinite_nan_and_huge_durations_are_refused(section: str, key: str, value: float) -> None:
    """Issue 14 item 8: accepted, then silently wrong (a sleep that never ends, an OverflowError per call)."""
    with pytest.raises(ConfigError, match=rf"c.yaml: {section}\.{key}: "):
        config_from_mapping({section: {key: value}}, "c.yaml")


def test_nan_or_infinite_numbers_are_refused_in_yaml_too(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("agent:\n  cap_fraction: .nan\nslurm:\n  retry_backoff_s: .inf\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert "agent.cap_fraction" in str(err.value) and "slurm.retry_backoff_s" in str(err.value)


def test_ten_years_is_the_longest_duration() -> None:
    cfg = config_from_mapping({"health": {"escalation_window_s": MAX_SECONDS}})
    assert cfg.health.escalation_window_s == MAX_SECONDS
    with pytest.raises(ConfigError, match="at most 315360000"):
        config_from_mapping({"health": {"escalation_window_s": MAX_SECONDS + 1}})


@pytest.mark.parametrize(("data", "where"), [
    ({"slurm": {"retries": True}}, "slurm.retries"),  # was read as 1
    ({"agent": {"cap_fraction": False}}, "agent.cap_fraction"),
    ({"agent": {"passive_interval_s": True}}, "agent.passive_interval_s"),
    ({"autoresume": {"runPolicy": {"noRetryExitCodes": [3, True]}}}, "autoresume.runPolicy.noRetryExitCodes"),
])
def test_true_false_where_a_number_is_expected_is_refused(data: dict[str, object], where: str) -> None:
    """Issue 14 item 10: `retries: true` silently became 1."""
    with pytest.raises(ConfigError, match=rf"{where}: Value error, must be a number, not true/false"):
        config_from_mapping(data, "c.yaml")


def test_fields_that_take_a_bool_still_take_one() -> None:
    cfg = config_from_mapping({"autoresume": {"runPolicy": {"retryOnApplicationError": True}},
                               "agent": {"dry_run": True}})
    assert cfg.autoresume.run_policy.retry_on_application_error is True and cfg.agent.dry_run is True
