"""Wrapper options: the configuration file's autoresume section fills what the command line leaves out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpresilience.autoresume.launch.plan import master_port
from hpresilience.autoresume.launch.srunargs import parse_srun_args
from hpresilience.autoresume.options import (
    DEFAULT_PORT_SPAN,
    EPHEMERAL_RANGE,
    job_id_from,
    master_port_span,
    options_from,
)
from hpresilience.autoresume.settings import AutoResumeSettings, LogRuleSettings, RunPolicySettings
from hpresilience.autoresume.watch import hangwatch
from hpresilience.errors import ConfigError


def test_config_values_apply_and_command_line_wins(tmp_path: Path) -> None:
    settings = AutoResumeSettings(
        poll_interval_s=2.5,
        master_port_base=31000,
        metrics_file="/m/x.prom",
        script_timeout_s=30,
        requeue_wait_s=10,
        state_dir=str(tmp_path),
    )
    args = parse_srun_args(["-N2", "train.sh"], frozenset(), frozenset())
    env = {"SLURM_JOB_ID": "7"}
    opts = options_from(settings, args, "/usr/bin/srun", env)
    assert (opts.poll_interval_s, opts.master_port_base, opts.metrics_path) == (2.5, 31000, "/m/x.prom")
    assert (opts.script_timeout_s, opts.requeue_wait_s, opts.state_dir) == (30, 10, tmp_path)
    cli = options_from(
        settings, args, "/usr/bin/srun", env, poll_interval_s=0.5, master_port_base=40000, metrics_path=""
    )
    assert (cli.poll_interval_s, cli.master_port_base, cli.metrics_path) == (0.5, 40000, None)
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir()
    default = options_from(
        AutoResumeSettings(state_dir=str(tmp_path), metrics_dir=str(textfiles)), args, "/usr/bin/srun", env
    )
    assert default.metrics_path == str(textfiles / "hpresilience_job_7.prom") and default.poll_interval_s == 1.0
    # No node_exporter directory: no file at all, rather than one nobody reads.
    nowhere = options_from(
        AutoResumeSettings(state_dir=str(tmp_path), metrics_dir=str(tmp_path / "absent")), args, "/usr/bin/srun", env
    )
    assert nowhere.metrics_path is None


def _srun(*args: str, job_id: str | None = "12") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    if job_id is not None:
        env["SLURM_JOB_ID"] = job_id
    env["HPRESILIENCE_REAL_SRUN"] = "/bin/false"  # a run that got past validation would exec this, not srun
    return subprocess.run(
        [sys.executable, "-m", "hpresilience", "srun", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.parametrize("value", ["yes", "true", "on", "-1", "1.0", ""])
def test_auto_resume_value_follows_the_shim(value: str) -> None:
    """Issue 14 item 10: `--auto-resume=yes` was supervised by the wrapper while the shim refused it."""
    res = _srun(f"--auto-resume={value}", "true")
    assert res.returncode == 2 and f"invalid --auto-resume value {value!r} (use 0 or 1)" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--auto-resume-replace-timeout", "nan"),
        ("--auto-resume-replace-timeout", "inf"),
        ("--auto-resume-poll-interval", "nan"),
        ("--auto-resume-shutdown-timeout", "inf"),
    ],
)
def test_nan_and_infinite_wrapper_durations_are_refused(option: str, value: str) -> None:
    """Issue 14 item 8: `--auto-resume-replace-timeout nan` passed click's range check (NaN compares false)."""
    res = _srun("--auto-resume=1", f"{option}={value}", "true")
    assert res.returncode == 2 and f"error: {option}: " in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr


def test_non_numeric_job_id_is_named_not_called_missing() -> None:
    """Issue 14 item 10: `SLURM_JOB_ID=abc` was reported as "not set"."""
    with pytest.raises(ConfigError, match="SLURM_JOB_ID is 'abc', not a Slurm job id"):
        job_id_from({"SLURM_JOB_ID": "abc"})
    with pytest.raises(ConfigError, match="SLURM_JOB_ID is not set"):
        job_id_from({})
    assert job_id_from({"SLURM_JOBID": "42"}) == 42


def test_min_nodes_and_grow_back_come_from_the_config_and_the_command_line_wins(tmp_path: Path) -> None:
    settings = AutoResumeSettings(min_nodes=3, grow_back="never", state_dir=str(tmp_path))
    args = parse_srun_args(["train.sh"], frozenset(), frozenset())
    opts = options_from(settings, args, "/usr/bin/srun", {"SLURM_JOB_ID": "7"})
    assert (opts.min_nodes, opts.grow_back) == (3, "never")
    assert options_from(settings, args, "/usr/bin/srun", {"SLURM_JOB_ID": "7"}, min_nodes=2).min_nodes == 2
    assert AutoResumeSettings().min_nodes == 0  # off unless asked: a fault waits for full size, as before


def test_a_negative_min_nodes_is_refused_with_the_option_named() -> None:
    res = _srun("--auto-resume=1", "--auto-resume-min-nodes=-1", "true")
    assert res.returncode == 2 and "--auto-resume-min-nodes" in res.stderr, res.stderr


def test_master_ports_stay_below_the_kernels_ephemeral_range(tmp_path: Path) -> None:
    """A port in the ephemeral range may be held by any outgoing connection: the rendezvous would fail (EADDRINUSE)."""
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    span = master_port_span(29500, range_file=ranges)
    assert span == 32768 - 29500
    assert max(master_port(29500, span, job, a) for job in range(1000, 1400) for a in range(1, 4)) < 32768
    # A base a site put inside the range is its choice; an unreadable range keeps the span.
    assert master_port_span(40000, range_file=ranges) == DEFAULT_PORT_SPAN
    assert master_port_span(29500, range_file=tmp_path / "missing") == DEFAULT_PORT_SPAN
    # The options the wrapper runs with carry this host's cut span.
    args = parse_srun_args(["-N2", "train.sh"], frozenset(), frozenset())
    opts = options_from(AutoResumeSettings(state_dir=str(tmp_path)), args, "/usr/bin/srun", {"SLURM_JOB_ID": "7"})
    assert opts.master_port_span == master_port_span(opts.master_port_base)
    if EPHEMERAL_RANGE.exists():
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
        assert low <= opts.master_port_base or opts.master_port_base + opts.master_port_span <= low


def _hang_watch_built(settings: AutoResumeSettings, tmp_path: Path) -> bool:
    from tests.autoresume.watch.test_table import _context

    opts = options_from(
        settings, parse_srun_args(["-N2", "train.sh"], frozenset(), frozenset()), "/usr/bin/srun", {"SLURM_JOB_ID": "7"}
    )
    return hangwatch.detector(_context(tmp_path, opts)) is not None


def test_hang_detection_stays_on_with_a_log_rule_configured(tmp_path: Path) -> None:
    """Issue 32: one rule (here a loss threshold, which says nothing about hangs) turned the built-in hang clock
    off, and with it the 60 s verdict on a silent step. Only `hang_detection: false` turns it off."""
    rule = LogRuleSettings.model_validate(
        {"name": "loss", "logPattern": r".*loss=([0-9.]+)", "metricThreshold": 10, "operator": "gt"}
    )
    with_rule = AutoResumeSettings(
        state_dir=str(tmp_path), runPolicy=RunPolicySettings(logMonitoringConfiguration=[rule])
    )
    assert _hang_watch_built(with_rule, tmp_path)
    assert _hang_watch_built(AutoResumeSettings(state_dir=str(tmp_path)), tmp_path)
    off = AutoResumeSettings(state_dir=str(tmp_path), hang_detection=False, runPolicy=with_rule.run_policy)
    assert not _hang_watch_built(off, tmp_path)


def test_a_command_line_value_is_the_one_value_every_part_reads(tmp_path: Path) -> None:
    # Issue 32: the options once copied fourteen settings beside the settings themselves, so a detector reading
    # opts.watch saw the file's spares while the supervisor used the command line's. One value per knob now.
    settings = AutoResumeSettings(spares=1, replace_timeout_s=60, state_dir=str(tmp_path))
    args = parse_srun_args(["-N2", "train.sh"], frozenset(), frozenset())
    opts = options_from(
        settings, args, "/usr/bin/srun", {"SLURM_JOB_ID": "7"}, spares=2, replace_timeout_s=5, grow=False
    )
    assert (opts.spares, opts.watch.spares) == (2, 2)
    assert (opts.replace_timeout_s, opts.watch.replace_timeout_s) == (5, 5)
    assert (opts.grow, opts.watch.grow_by_expansion) == (False, False)
    assert settings.spares == 1  # the file's settings are not changed in place


def test_a_command_line_value_the_settings_refuse_is_a_config_error(tmp_path: Path) -> None:
    args = parse_srun_args(["-N2", "train.sh"], frozenset(), frozenset())
    with pytest.raises(ValueError, match="spares"):
        options_from(
            AutoResumeSettings(state_dir=str(tmp_path)), args, "/usr/bin/srun", {"SLURM_JOB_ID": "7"}, spares=-1
        )
