"""Configuration section for the node agent (schedule, guard rails, metrics address)."""

from __future__ import annotations

from pydantic import Field

from hpresilience.health.base import Mode
from hpresilience.reasons import NODE_NOTICE_FILE
from hpresilience.settings_base import Section


class NoticeSettings(Section):
    """Cloud notices of a reclaim or a maintenance (agent/notices.py): the node is drained before it goes."""

    # Notice sources by name (agent/notices.py's registry; "ec2": instance metadata, IMDSv2). A source whose
    # endpoint does not answer (not on that cloud) turns itself off and is asked again every `reprobe_s`.
    sources: tuple[str, ...] = ("ec2",)
    # The EC2 instance metadata endpoint (tests and `hpresilience.testing.fakeimds` point it elsewhere).
    ec2_endpoint: str = "http://169.254.169.254"
    # Absolute limit of one metadata request (token, spot action or scheduled events).
    timeout_s: float = Field(default=1.0, gt=0, le=30)
    reprobe_s: float = Field(default=3600.0, gt=0)
    # Between check cycles the sources are also read this often; news (a notice, or one withdrawn) runs a cycle
    # at once: a spot reclaim gives two minutes, which a 30 s cycle would cut to 90 s.
    poll_interval_s: float = Field(default=5.0, gt=0)
    # A scheduled maintenance drains the node this long before its start (NotBefore), not as soon as it is
    # announced (days ahead): the wrapper moves the step off a drained node at its next checkpoint.
    maintenance_lead_s: float = Field(default=3600.0, ge=0)
    # Where the node notice file is written for hpresilience.torch's check_alive(); a root-owned directory
    # that users cannot write (the agent's unit makes it: RuntimeDirectory=hpresilience). Empty: none.
    notice_file: str = NODE_NOTICE_FILE


class AgentSettings(Section):
    """Settings for the node agent; every field has a default that works with no file."""

    # Slurm node name of this host; empty: $SLURMD_NODENAME, else the short host name.
    node_name: str = ""
    passive_interval_s: float = Field(default=30.0, gt=0)
    # Active checks stress hardware: only when Slurm shows the node idle, or drained by us, and at most this often.
    active_interval_s: float = Field(default=3600.0, gt=0)
    active_checks: bool = True
    # A failing verdict must be seen this many runs in a row before the node is marked, unless the check is certain.
    required_repeats: int = Field(default=2, ge=1, le=20)
    # Fleet ceiling: at most this share of the node's partition (at least max_out_min nodes) may be out of
    # service for hpresilience's reasons at once (agent marks, controller repairs, nodes left for a person);
    # a mark past it is held (logged, counted, alerted), not applied.
    max_out_fraction: float = Field(default=0.10, gt=0, le=1)
    max_out_min: int = Field(default=1, ge=0)
    # Resume a node the agent itself marked once its faults have cleared (e.g. after a reboot).
    resume_when_clear: bool = True
    # observe: run the checks, log and count (decision="would_mark") what would be done, never touch Slurm;
    # enforce: mark and resume nodes. `hpresilience install` writes observe for a new site (docs/rollout.md).
    mode: Mode = Mode.ENFORCE
    # The same as mode: observe (kept for configs and `agent --dry-run`).
    dry_run: bool = False
    # Prometheus /metrics and /healthz; loopback by default. Empty disables the server.
    metrics_address: str = "127.0.0.1:9761"
    # The longest one check cycle may take (above every active check's own timeout): past it the watchdog
    # thread stops pinging systemd and the agent is restarted.
    cycle_timeout_s: float = Field(default=3600.0, gt=0)
    # Where the agent keeps what must survive a restart (repeat counters, last results).
    state_dir: str = "/var/lib/hpresilience/agent"
    # Reclaim and maintenance notices from the cloud (planned drains).
    notices: NoticeSettings = Field(default_factory=NoticeSettings)
