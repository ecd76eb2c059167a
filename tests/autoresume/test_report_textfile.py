"""The wrapper's per-job .prom files: in node_exporter's textfile directory, and old ones cleaned up."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import click

from hpresilience.autoresume.report import default_metrics_path, prune_textfiles
from hpresilience.autoresume.settings import AutoResumeSettings


def test_files_of_jobs_over_long_ago_are_removed(tmp_path: Path) -> None:
    old, recent, mine, other = (tmp_path / f"hpresilience_job_{i}.prom" for i in (1, 2, 3, 4))
    foreign = tmp_path / "node_health.prom"
    for p in (old, recent, mine, other, foreign):
        p.write_text("x 1\n")
    week_ago = time.time() - 7 * 86400
    for p in (old, mine, foreign):
        os.utime(p, (week_ago, week_ago))
    removed = prune_textfiles(tmp_path, 86400, keep=3)
    assert removed == [old.name]
    assert mine.exists() and recent.exists() and other.exists() and foreign.exists()


def test_default_path_prunes_and_names_the_job(tmp_path: Path) -> None:
    stale = tmp_path / "hpresilience_job_9.prom"
    stale.write_text("x 1\n")
    os.utime(stale, (0, 0))
    path = default_metrics_path(AutoResumeSettings(metrics_dir=str(tmp_path), metrics_retention_s=60), 12)
    assert path == str(tmp_path / "hpresilience_job_12.prom") and not stale.exists()
    assert default_metrics_path(AutoResumeSettings(metrics_dir=str(tmp_path / "none")), 12) == ""


def test_srun_help_names_the_metrics_file_the_wrapper_writes(tmp_path: Path) -> None:
    """Issue 21 defect 10: the help promised <state dir>/<job id>.prom, a file the wrapper never writes."""
    from hpresilience.commands.srun import srun

    [option] = [p for p in srun.params if p.name == "metrics_file"]
    assert isinstance(option, click.Option) and option.help
    [said] = re.findall(r"default: (\S+\.prom)", option.help)
    written = default_metrics_path(AutoResumeSettings(metrics_dir=str(tmp_path)), 4242)
    assert said.replace("<autoresume.metrics_dir>", str(tmp_path)).replace("<JOBID>", "4242") == written
