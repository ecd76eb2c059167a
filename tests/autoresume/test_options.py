"""Wrapper options: the configuration file's autoresume section fills what the command line leaves out."""

from __future__ import annotations

from pathlib import Path

from hpresilience.autoresume.options import options_from
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.autoresume.srunargs import parse_srun_args


def test_config_values_apply_and_command_line_wins(tmp_path: Path) -> None:
    settings = AutoResumeSettings(poll_interval_s=2.5, master_port_base=31000, metrics_file="/m/x.prom",
                                  script_timeout_s=30, requeue_wait_s=10, state_dir=str(tmp_path))
    args = parse_srun_args(["-N2", "train.sh"], frozenset(), frozenset())
    env = {"SLURM_JOB_ID": "7"}
    opts = options_from(settings, args, "/usr/bin/srun", env)
    assert (opts.poll_interval_s, opts.master_port_base, opts.metrics_path) == (2.5, 31000, "/m/x.prom")
    assert (opts.script_timeout_s, opts.requeue_wait_s, opts.state_dir) == (30, 10, tmp_path)
    cli = options_from(settings, args, "/usr/bin/srun", env, poll_interval_s=0.5, master_port_base=40000,
                       metrics_path="")
    assert (cli.poll_interval_s, cli.master_port_base, cli.metrics_path) == (0.5, 40000, None)
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir()
    default = options_from(AutoResumeSettings(state_dir=str(tmp_path), metrics_dir=str(textfiles)), args,
                           "/usr/bin/srun", env)
    assert default.metrics_path == str(textfiles / "hpresilience_job_7.prom") and default.poll_interval_s == 1.0
    # No node_exporter directory: no file at all, rather than one nobody reads.
    nowhere = options_from(AutoResumeSettings(state_dir=str(tmp_path), metrics_dir=str(tmp_path / "absent")), args,
                           "/usr/bin/srun", env)
    assert nowhere.metrics_path is None
