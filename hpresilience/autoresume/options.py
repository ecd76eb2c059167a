"""Everything one wrapper run needs, resolved once from the configuration file and the command line."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hpresilience.autoresume.launch.srunargs import SrunArgs
from hpresilience.autoresume.optiontable import SRUN_OPTIONS, Target
from hpresilience.autoresume.report import default_metrics_path
from hpresilience.autoresume.settings import AutoResumeSettings, RunPolicySettings, load_rules_file
from hpresilience.autoresume.state import default_state_dir
from hpresilience.errors import ConfigError
from hpresilience.settings_base import validation_problems

# MASTER_PORT is drawn from [base, base + span). The span stops where the kernel's ephemeral range begins: a port in
# it may be held by any outgoing connection on the node (a rank's own, another job's), and the rendezvous then fails
# with EADDRINUSE (seen on a busy 2-core CI machine with the default 29500 + 20000 reaching into 32768-60999).
DEFAULT_PORT_SPAN = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def master_port_span(base: int, span: int = DEFAULT_PORT_SPAN, range_file: Path = EPHEMERAL_RANGE) -> int:
    """How many ports above `base` MASTER_PORT may take: `span`, cut at the start of this host's ephemeral range
    when `base` lies below it (a base a site set inside the range is its own choice, kept)."""
    try:
        low = int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return span
    return min(span, low - base) if low > base else span


@dataclass(frozen=True)
class WrapperOptions:
    """One wrapper run's options. The settings (`watch`: the configuration file's section, the command line's
    values merged in and validated by the same model) are read through it, never copied: one value per knob."""

    job_id: int
    srun: SrunArgs
    srun_bin: str
    run_policy: RunPolicySettings
    state_dir: Path
    metrics_path: str | None = None
    master_port_span: int = DEFAULT_PORT_SPAN
    pre_train_script: str | None = None
    post_train_script: str | None = None
    watch: AutoResumeSettings = field(default_factory=AutoResumeSettings)

    @property
    def spares(self) -> int:
        return self.watch.spares

    @property
    def grow(self) -> bool:
        return self.watch.grow_by_expansion

    @property
    def fallback(self) -> str:
        return self.watch.fallback_when_no_replacement

    @property
    def replace_timeout_s(self) -> float:
        return self.watch.replace_timeout_s

    @property
    def shutdown_signal(self) -> int:
        return int(signal.Signals[self.watch.shutdown_signal])

    @property
    def shutdown_timeout_s(self) -> float:
        return self.watch.shutdown_timeout_s

    @property
    def max_line_bytes(self) -> int:
        return self.watch.max_line_bytes

    @property
    def poll_interval_s(self) -> float:
        return self.watch.poll_interval_s

    @property
    def full_node_check_s(self) -> float:
        return self.watch.full_node_check_s

    @property
    def master_port_base(self) -> int:
        return self.watch.master_port_base

    @property
    def script_timeout_s(self) -> float:
        return self.watch.script_timeout_s

    @property
    def requeue_wait_s(self) -> float:
        return self.watch.requeue_wait_s

    @property
    def min_nodes(self) -> int:
        return self.watch.min_nodes

    @property
    def grow_back(self) -> str:
        return self.watch.grow_back

    @property
    def hang_detection(self) -> bool:
        """Whether the built-in hang clock runs: as `hang_detection` says, whatever log rules are configured.
        A rule watches what its author chose (a metric, a start cut-off, one line's rhythm); a user with one
        such rule must not lose the 60 s verdict on a step gone silent (issue 32). `hang_detection: false`
        leaves hangs to the rules alone."""
        return self.watch.hang_detection

    def step_size(self, allocation_size: int) -> int:
        """Nodes per step: srun's -N when given, else the allocation minus the hot spares."""
        size = self.srun.nodes if self.srun.nodes else allocation_size - self.spares
        if size < 1:
            raise ConfigError(
                f"the allocation has {allocation_size} node(s) and {self.spares} are kept as hot "
                "spares: no node is left for the step"
            )
        return size


def job_id_from(env: Mapping[str, str]) -> int:
    raw = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not raw:
        raise ConfigError(
            "srun --auto-resume runs inside a job: SLURM_JOB_ID is not set "
            "(start it from an sbatch script or an salloc shell)"
        )
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise ConfigError(f"SLURM_JOB_ID is {raw[:40]!r}, not a Slurm job id (a whole number)")
    return int(raw)


def options_from(
    settings: AutoResumeSettings,
    srun: SrunArgs,
    srun_bin: str,
    env: Mapping[str, str],
    *,
    run_policy: RunPolicySettings | None = None,
    spares: int | None = None,
    grow: bool | None = None,
    fallback: str | None = None,
    replace_timeout_s: float | None = None,
    state_dir: str | None = None,
    metrics_path: str | None = None,
    poll_interval_s: float | None = None,
    master_port_base: int | None = None,
    pre_train_script: str | None = None,
    post_train_script: str | None = None,
    min_nodes: int | None = None,
) -> WrapperOptions:
    """Command-line values win over the configuration file; the rest are the file's (or its defaults)."""
    job_id = job_id_from(env)
    directory = Path(state_dir or settings.state_dir or default_state_dir(dict(env)))
    if metrics_path is None:
        metrics_path = settings.metrics_file or default_metrics_path(settings, job_id)
    for script in (pre_train_script, post_train_script):
        if script and not os.access(script, os.X_OK):
            raise ConfigError(f"pre/post-train script {script!r} is not an executable file")
    # The keyword values the command line gave (None, or 0 for the timeouts and the port: not given) go into the
    # settings, through the model's own checks, so that every knob has one value.
    given = {
        "spares": spares,
        "grow_by_expansion": grow,
        "fallback_when_no_replacement": fallback or None,
        "replace_timeout_s": replace_timeout_s or None,
        "poll_interval_s": poll_interval_s or None,
        "master_port_base": master_port_base or None,
        "min_nodes": min_nodes,
    }
    updates = {k: v for k, v in given.items() if v is not None}
    if updates:
        settings = type(settings).model_validate({**settings.model_dump(), **updates})
    return WrapperOptions(
        job_id=job_id,
        srun=srun,
        srun_bin=srun_bin,
        run_policy=run_policy or settings.run_policy,
        state_dir=directory,
        metrics_path=metrics_path or None,
        master_port_span=master_port_span(settings.master_port_base),
        pre_train_script=pre_train_script,
        post_train_script=post_train_script,
        watch=settings,
    )


def resolve(
    settings: AutoResumeSettings, srun: SrunArgs, given: Mapping[str, Any], srun_bin: str, env: Mapping[str, str]
) -> WrapperOptions:
    """The wrapper's options from the configuration's section and the command line's values (by `dest`)."""
    option_of_field = {o.field: o.spelled for o in SRUN_OPTIONS if o.target is Target.SETTINGS and o.field}
    updates = {
        o.field: given[o.dest]
        for o in SRUN_OPTIONS
        if o.target is Target.SETTINGS and o.field and given.get(o.dest) is not None
    }
    if updates:
        # Through the settings model, so the command line gets the file's checks (no NaN, no infinity).
        try:
            settings = type(settings).model_validate({**settings.model_dump(), **updates})
        except ValidationError as err:
            # The settings' own checks, told in the command line's words: the option, not the key path.
            path, message = validation_problems(err)[0]
            raise ConfigError(f"{option_of_field.get(path, '--auto-resume-*')}: {message}") from None
    rules = given.get("rules")
    policy = load_rules_file(rules, settings.run_policy) if rules else None
    keywords = {o.field: given.get(o.dest) for o in SRUN_OPTIONS if o.target is Target.KEYWORD and o.field}
    try:
        return options_from(settings, srun, srun_bin, env, run_policy=policy, **keywords)
    except ValueError as err:
        raise ConfigError(f"srun --auto-resume: {err}") from None
