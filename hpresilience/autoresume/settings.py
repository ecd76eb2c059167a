"""Configuration section for srun --auto-resume (log rules, restart policy, spares).

A HyperPod `runPolicy:` block (camelCase keys) can be pasted under `autoresume:` unchanged; our own
keys are snake_case beside it, except the two policy extensions that live inside `runPolicy`
(`retryOnApplicationError`, `noRetryExitCodes`). Semantics: docs/auto-resume-rules.md.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from hpresilience.errors import ConfigError
from hpresilience.fileio import read_yaml
from hpresilience.settings_base import Section, format_validation_error

Operator = Literal["gt", "gteq", "lt", "lteq", "eq"]


class LogRuleSettings(Section):
    """One entry of `logMonitoringConfiguration`: HyperPod's keys, plus `faultOnMatch` and `action`."""

    name: str = Field(min_length=1)
    log_pattern: str = Field(alias="logPattern", min_length=1)
    expected_start_cutoff_s: float | None = Field(default=None, alias="expectedStartCutOffInSeconds", gt=0)
    expected_recurring_frequency_s: float | None = Field(
        default=None, alias="expectedRecurringFrequencyInSeconds", gt=0
    )
    stop_pattern: str | None = Field(default=None, alias="stopPattern", min_length=1)
    metric_threshold: float | None = Field(default=None, alias="metricThreshold")
    operator: Operator | None = None
    metric_evaluation_data_points: int | None = Field(default=None, alias="metricEvaluationDataPoints", ge=1)
    # HyperPod's own agent knows this key: a match is a fault at once (e.g. "NCCL error").
    fault_on_match: bool = Field(default=False, alias="faultOnMatch")
    # Our extension: `restart` (HyperPod's behaviour) or `log` (report the trip, keep the step running).
    action: Literal["restart", "log"] = "restart"

    @model_validator(mode="after")
    def _check_rule(self) -> LogRuleSettings:
        groups = self._pattern_groups()
        if (self.metric_threshold is None) != (self.operator is None):
            raise ValueError(f"rule {self.name!r}: metricThreshold and operator must be given together")
        if self.metric_threshold is not None and groups is not None and groups < 1:
            raise ValueError(
                f"rule {self.name!r}: metricThreshold needs a capture group in logPattern "
                "(the first group is the metric)"
            )
        if self.metric_evaluation_data_points is not None and self.metric_threshold is None:
            raise ValueError(f"rule {self.name!r}: metricEvaluationDataPoints needs metricThreshold and operator")
        if (
            self.expected_start_cutoff_s is None
            and self.expected_recurring_frequency_s is None
            and self.metric_threshold is None
            and not self.fault_on_match
        ):
            raise ValueError(
                f"rule {self.name!r} checks nothing: set expectedStartCutOffInSeconds, "
                "expectedRecurringFrequencyInSeconds, metricThreshold with operator, or faultOnMatch"
            )
        return self

    def _pattern_groups(self) -> int | None:
        """Compile the patterns on RE2 (a bad one is an error naming the rule); the capture groups of logPattern.

        None where RE2 is not installed: a training environment (`hpresilience[torch]`, no `node` extra)
        reads the same config.yaml for `hpresilience job`, and runs no rule; the wrapper, which runs them,
        needs the node extra and compiles every pattern again (rules.py) before the step starts.
        """
        try:
            from hpresilience.autoresume.watch.regex import compile_rule_pattern
        except ModuleNotFoundError as e:
            if e.name != "re2":
                raise
            return None
        compiled = compile_rule_pattern(self.name, "logPattern", self.log_pattern)
        if self.stop_pattern is not None:
            compile_rule_pattern(self.name, "stopPattern", self.stop_pattern)
        return compiled.groups

    @property
    def data_points(self) -> int:
        return self.metric_evaluation_data_points or 1


class RestartPolicySettings(Section):
    """HyperPod's `restartPolicy`: when process-level restarts escalate to a full (requeue) restart."""

    num_restart_before_full_job_restart: int = Field(default=3, alias="numRestartBeforeFullJobRestart", ge=0)
    eval_period_seconds: float = Field(default=21600.0, alias="evalPeriodSeconds", gt=0)
    max_full_job_restarts: int = Field(default=1, alias="maxFullJobRestarts", ge=0)


class RunPolicySettings(Section):
    """HyperPod's `runPolicy` block, accepted as pasted."""

    job_max_retry_count: int = Field(default=10, alias="jobMaxRetryCount", ge=0)
    restart_policy: RestartPolicySettings = Field(default_factory=RestartPolicySettings, alias="restartPolicy")
    # Accepted so a pasted block loads; on Slurm every process of a step ends with the step, so it has no effect.
    clean_pod_policy: Literal["All", "OnlyComplete", "None"] = Field(default="All", alias="cleanPodPolicy")
    log_monitoring_configuration: list[LogRuleSettings] = Field(
        default_factory=list, alias="logMonitoringConfiguration"
    )
    # Our extensions. false/0: an application error ends the job; true: retried like any fault; N: at most N times.
    retry_on_application_error: bool | int = Field(default=False, alias="retryOnApplicationError")
    # Exit codes that mean "do not retry" whatever the budget (the training script's own verdict).
    no_retry_exit_codes: list[int] = Field(default_factory=list, alias="noRetryExitCodes")

    @field_validator("retry_on_application_error")
    @classmethod
    def _non_negative(cls, v: bool | int) -> bool | int:
        if not isinstance(v, bool) and v < 0:
            raise ValueError("must be true, false or a count >= 0")
        return v

    @model_validator(mode="after")
    def _unique_rule_names(self) -> RunPolicySettings:
        seen: set[str] = set()
        for rule in self.log_monitoring_configuration:
            if rule.name in seen:
                raise ValueError(f"rule name {rule.name!r} is used twice in logMonitoringConfiguration")
            seen.add(rule.name)
        return self

    def with_rules(self, rules: list[LogRuleSettings]) -> RunPolicySettings:
        return self.model_copy(update={"log_monitoring_configuration": list(rules)})


class AutoResumeSettings(Section):
    """Settings for srun --auto-resume (log rules, restart policy, spares). Defaults work with no file."""

    run_policy: RunPolicySettings = Field(default_factory=RunPolicySettings, alias="runPolicy")
    # Nodes held back in the allocation as hot spares (the step runs on the others).
    spares: int = Field(default=0, ge=0)
    # How long to wait for a replacement node (cluster-side replace or expansion) before the fallback.
    replace_timeout_s: float = Field(default=900.0, gt=0)
    # How a step is stopped before a restart: this signal, then SIGKILL after the timeout.
    shutdown_signal: str = "SIGTERM"
    shutdown_timeout_s: float = Field(default=30.0, ge=0)
    # Grow the allocation back with Slurm's (undocumented) job expansion; used only where the cluster permits
    # it (SchedulerParameters=permit_job_expansion, probed once), else a fault without a spare requeues.
    grow_by_expansion: bool = True
    # After a fault with no spare: relaunch at once on the healthy nodes when at least this many (0: off, wait for
    # a replacement at full size); the step gets HPR_NODES_REQUESTED and HPR_NODES_NOW (docs/auto-resume.md).
    min_nodes: int = Field(default=0, ge=0)
    # While running short: move the step back to full size as soon as the nodes left out are back in service
    # (immediate, from its last checkpoint), or never (the step ends on the nodes it has).
    grow_back: Literal["immediate", "never"] = "immediate"
    # A planned move first tells the ranks (check_alive() turns False: save and exit); a step still running
    # this long after the notice is stopped (shutdown_signal) and relaunched from its last checkpoint.
    move_grace_s: float = Field(default=120.0, ge=0)
    # No replacement node within replace_timeout_s: requeue the whole job, or fail it.
    fallback_when_no_replacement: Literal["requeue", "fail"] = "requeue"
    # How a node fault is recovered: relaunch every rank (from the last checkpoint), or inprocess: the survivors
    # keep running and the replacement's ranks take their state from a peer (autoresume/inprocess.py, issue 33).
    recovery_mode: Literal["relaunch", "inprocess"] = "relaunch"
    # The in-process mode's bound: a recovery whose new world has not formed (its first step done) this long after
    # the world was written falls back to the relaunch path (autoresume/inprocessguard.py).
    inprocess_recovery_s: float = Field(default=120.0, gt=0)
    # In the inprocess mode: run warm standby ranks on the hot spares (started ahead of any fault, torch imported
    # and the model built, waiting to be named in a world: autoresume/launch/standby.py), or off: a replacement's
    # ranks start only once its node is chosen.
    standby: Literal["spares", "off"] = "spares"

    @field_validator("standby", mode="before")
    @classmethod
    def _standby_off(cls, v: object) -> object:
        return "off" if v is False else v  # YAML reads a bare `off` as false: what the user wrote is "off"

    # In the inprocess mode, between faults: a spare that goes out of service leaves the job, and a spare spent on a
    # replacement (or gone) is made good by a node this job released, once back in service and idle (with a standby
    # on it), so later faults are as cheap as the first (autoresume/decide/spares.py). Taking nodes back needs
    # growing (grow_by_expansion and the cluster's permit_job_expansion).
    refill_spares: bool = True
    # Seconds between those looks at the spares and the released nodes (two reads sized by the job; a repair takes
    # minutes, and a spare out of service need only leave before the next fault).
    spare_check_s: float = Field(default=30.0, gt=0)

    # Longer output lines are cut to this many bytes before the log rules see them (the user's output is not cut).
    max_line_bytes: int = Field(default=65536, ge=256)
    # Where per-job state survives a requeue; must be on a shared file system.
    # Empty: $SLURM_SUBMIT_DIR/.hpresilience/jobs, else ~/.hpresilience/jobs.
    state_dir: str = ""
    # Seconds between looks at the job's own record while the step runs (one job query each: the controller
    # writes the job's bad nodes there; autoresume/nodewatch.py). A job the controller watches (its lease, its
    # nudge seen) is read only when nudged and every 60 s instead.
    poll_interval_s: float = Field(default=1.0, ge=0.1)
    # Also read the step's nodes themselves this often, for clusters where no controller tells the jobs (a node
    # query costs slurmctld its whole node table). 0: never, trust the controller's notices alone.
    full_node_check_s: float = Field(default=120.0, ge=0)
    # MASTER_PORT is this plus an offset that changes every attempt (no TIME_WAIT or stale-store clashes).
    master_port_base: int = Field(default=29500, ge=1024, le=45000)
    # Prometheus textfile; empty: <metrics_dir>/hpresilience_job_<job id>.prom when that directory is writable.
    metrics_file: str = ""
    # node_exporter's textfile-collector directory (Debian's prometheus-node-exporter reads this one). Files of
    # jobs older than metrics_retention_s are removed by the next wrapper that starts on the node.
    metrics_dir: str = "/var/lib/prometheus/node-exporter"
    metrics_retention_s: float = Field(default=86400.0, gt=0)
    # --pre-train-script / --post-train-script are killed after this long.
    script_timeout_s: float = Field(default=600.0, gt=0)
    # After asking Slurm to requeue the job, how long the wrapper waits to be replaced by the new batch run.
    requeue_wait_s: float = Field(default=120.0, gt=0)
    # Sick, not dead (docs/hangs.md). Progress is read from the step's output and hpresilience.torch heartbeats.
    # Hang: once the step showed progress, silence longer than max(hang_floor_s, hang_interval_factor x the
    # median interval between progress events); between the first and the second event, hang_first_step_s.
    # Only while the step still has tasks: a step whose tasks ended while a process that escaped it (proctrack/pgid,
    # a daemon started with setsid) keeps srun's output open is ended instead (the escaped processes are reaped).
    hang_detection: bool = True
    hang_floor_s: float = Field(default=60.0, gt=0)
    hang_interval_factor: float = Field(default=10.0, gt=0)
    hang_first_step_s: float = Field(default=300.0, gt=0)
    # Stacks and process states of every rank are collected within this bound before the step is killed.
    hang_evidence_timeout_s: float = Field(default=10.0, gt=0)
    # PyTorch's flight recorder: entries per rank (TORCH_FR_BUFFER_SIZE, TORCH_NCCL_TRACE_BUFFER_SIZE, unless the
    # step's environment sets them), dumps into the attempt's private evidence directory (docs/hangs.md). 0: off.
    flight_recorder_entries: int = Field(default=2000, ge=0, le=1_000_000)
    # A node named by unambiguous evidence (a hang, or a collective failure twice) is marked Action:Reboot.
    mark_suspect_nodes: bool = True
    # A collective timeout/abort with every node healthy: wait this long for a verdict, then relaunch on the
    # same nodes, at most collective_retries times per runPolicy.restartPolicy.evalPeriodSeconds.
    collective_settle_s: float = Field(default=5.0, ge=0, le=120)
    collective_retries: int = Field(default=2, ge=0)
    # Stragglers: a node slower than the other nodes' median by more than straggler_fraction in most of the
    # last straggler_windows windows of straggler_window_s seconds.
    straggler_fraction: float = Field(default=0.2, gt=0)
    straggler_windows: int = Field(default=5, ge=1)
    straggler_window_s: float = Field(default=10.0, gt=0)
    exclude_stragglers: bool = False
    # Per-task output labels (srun --label, removed again from what the user sees) name a line's node.
    label_tasks: bool = True
    # A node whose tasks printed progress and then nothing for max(silent_node_s, 3 x the median interval between
    # progress lines) while another node's went on is probed (one trivial task, 3 s); one that does not answer is a
    # hardware fault (a partition or a hung NIC, which Slurm calls down only after SlurmdTimeout). 0: off.
    silent_node_s: float = Field(default=4.0, ge=0)
    # The whole step silent for max(silent_step_s, 3 x the median interval between progress events): every node of
    # the step is probed (one trivial task each, 3 s, all at once); one that does not answer while another does is
    # a hardware fault (a partition under synchronous training, where every rank blocks at once). 0: off.
    silent_step_s: float = Field(default=3.0, ge=0)
    # hpresilience.torch heartbeats write at most one line per rank this often (HPR_HEARTBEAT_EVERY_S).
    heartbeat_every_s: float = Field(default=5.0, ge=0)
    # Wrong, not dead (docs/integrity.md). A node named this many times by hpresilience.torch's replica check
    # (a data-parallel replica whose parameters disagree with the others') is marked Action:Replace; before
    # that, the step is relaunched on the same nodes; either way from a checkpoint at or before the last check
    # that passed.
    replica_mark_after: int = Field(default=2, ge=1)
    # A non-finite loss or grad norm, or a loss spike (robust z-score above loss_spike_z over the last
    # loss_spike_window values of a rank, once loss_spike_min_samples came): `stop` ends the job with the
    # reason; `rollback` relaunches from the newest checkpoint before the step, telling the ranks to skip the
    # loss_skip_steps steps that end at it (HPR_SKIP_STEPS), at most loss_rollbacks times; `off` ignores both.
    loss_policy: Literal["stop", "rollback", "off"] = "stop"
    loss_spike_z: float = Field(default=10.0, gt=0)
    loss_spike_window: int = Field(default=50, ge=3)
    loss_spike_min_samples: int = Field(default=20, ge=3)
    loss_skip_steps: int = Field(default=1, ge=1)
    loss_rollbacks: int = Field(default=3, ge=0)
    # Crash loops (decide/crashloop.py, docs/crash-loops.md): this many attempts in a row ending at the same step
    # with the same signature (exit code + the error's normalized last lines) stop the job, no node marked. 0: off.
    crash_loop_bound: int = Field(default=3, ge=0)
    # The same crash at this many different steps with the same node failing first marks that node (2: a suspect
    # in the events). 0: never marked.
    crash_suspect_mark_after: int = Field(default=3, ge=0)
    # A node found bad by two failed attempts within this window is a suspect in the events (`node_blamed_again`):
    # a node repaired, back in service, and failing again.
    blame_window_s: float = Field(default=21600.0, gt=0)
    # Exit codes that stop the job at once (Megatron's 17: failed on result validation; NVRx's 93: no progress),
    # and that ask for a rerun on other nodes (Megatron's 16: resume to disambiguate; not an application error).
    stop_exit_codes: list[int] = Field(default_factory=lambda: [17, 93])
    # After a restore, the first this-many redone steps' losses (`step=N ... loss=X` lines) are compared with the
    # same steps' before the fault; a relative difference above the tolerance is reported (watch/replay.py). 0: off.
    restore_loss_steps: int = Field(default=5, ge=0)
    restore_loss_tolerance: float = Field(default=1e-3, ge=0)
    rerun_exit_codes: list[int] = Field(default_factory=lambda: [16])
    # Preflight on a new node set (decide/preflight.py, docs/crash-loops.md): before a relaunch onto nodes that did
    # not run the previous attempt, one gloo all-reduce and a preflight_mb transfer from a node of that attempt to
    # every node, all within preflight_timeout_s; a new node that does not join, fails, or transfers under
    # preflight_min_mb_per_s or slower than preflight_slow_factor x the others' median is kept out of the step.
    # Off by default: it adds ~2 s (Python and torch started on every node) to each relaunch onto a spare or a
    # grown node, the path that must stay the fast one; a site whose nodes fail on the wire more than in the box
    # turns it on.
    preflight: bool = False
    preflight_timeout_s: float = Field(default=20.0, gt=0, le=300)
    preflight_mb: float = Field(default=4.0, gt=0, le=256)
    preflight_min_mb_per_s: float = Field(default=2.0, ge=0)
    preflight_slow_factor: float = Field(default=5.0, gt=1)
    preflight_rounds: int = Field(default=2, ge=1, le=10)

    @field_validator("stop_exit_codes", "rerun_exit_codes")
    @classmethod
    def _exit_codes(cls, v: list[int]) -> list[int]:
        bad = [c for c in v if not 1 <= c <= 255]
        if bad:
            raise ValueError(f"exit codes are 1-255, got {bad}")
        return v

    @field_validator("shutdown_signal")
    @classmethod
    def _signal_name(cls, v: str) -> str:
        name = v.strip().upper()
        if name.isdigit():
            try:
                return signal.Signals(int(name)).name
            except ValueError:
                raise ValueError(f"unknown signal number {v!r}") from None
        if not name.startswith("SIG"):
            name = "SIG" + name
        if name not in signal.Signals.__members__:
            raise ValueError(f"unknown signal {v!r} (e.g. SIGTERM, SIGINT, SIGUSR1)")
        return name


def rules_from_data(data: Any, base: RunPolicySettings, source: str = "<rules>") -> RunPolicySettings:
    """A rules document in any of the three shapes `--auto-resume-rules` accepts, applied over `base`.

    - a list of rules: replaces `logMonitoringConfiguration`;
    - a mapping with `logMonitoringConfiguration`: the same;
    - a mapping with `runPolicy` (a pasted HyperPod block, or a whole job.yaml `spec`): the whole policy.
    """
    if isinstance(data, dict) and "spec" in data and isinstance(data["spec"], dict):
        data = data["spec"]
    try:
        if isinstance(data, list):
            # Through RunPolicySettings, not a bare list: its validators (unique names) must run here too.
            return RunPolicySettings.model_validate(
                {**base.model_dump(by_alias=True), "logMonitoringConfiguration": data}
            )
        if isinstance(data, dict) and set(data) == {"logMonitoringConfiguration"}:
            return RunPolicySettings.model_validate(
                {**base.model_dump(by_alias=True), "logMonitoringConfiguration": data["logMonitoringConfiguration"]}
            )
        if isinstance(data, dict) and set(data) == {"runPolicy"}:
            # An empty `runPolicy:` means the defaults; `runPolicy: []` (or any non-mapping) is a mistake.
            policy = data["runPolicy"]
            if policy is not None and not isinstance(policy, dict):
                raise ConfigError(f"{source}: runPolicy: must be a mapping, got {type(policy).__name__}")
            return RunPolicySettings.model_validate({} if policy is None else policy)
    except ValidationError as err:
        # The list shape is the rules themselves: errors are placed as `[i].key`, as the file reads.
        skip = "logMonitoringConfiguration" if isinstance(data, list) else None
        raise ConfigError(format_validation_error(source, err, skip=skip)) from None
    keys = ", ".join(sorted(map(str, data))) if isinstance(data, dict) else type(data).__name__
    raise ConfigError(
        f"{source}: expected a list of rules, or a mapping with logMonitoringConfiguration or "
        f"runPolicy (and nothing else), got {keys}"
    )


def load_rules_file(path: str | Path, base: RunPolicySettings | None = None) -> RunPolicySettings:
    """Read the file given by `--auto-resume-rules FILE`; every mistake is a ConfigError naming file and rule."""
    p = Path(path)
    data = read_yaml(p, "rules file")
    return rules_from_data(data, base if base is not None else RunPolicySettings(), str(p))
