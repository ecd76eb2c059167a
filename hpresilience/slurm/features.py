"""Slurm's own resilience features that newer releases have, probed once from `scontrol --version` and
`scontrol show config` (a pure reading of those two outputs; SlurmClient.features() reads them, and the caller
probes once at start and says what it found).

What each one changes for the project, and the release that has it:
- expedited_requeue (25.11+, `SlurmctldParameters=enable_expedited_requeue`): a job submitted with
  `--requeue=expedite` is started again at once when requeued, at the top of the queue; 26.05.5 ran such a job
  again 2 s after `scontrol requeue`, where the same job without it was held 121 s (cred_expire + 1 s). The
  batch-host path then needs no release by the controller.
- requeue_delay_s (25.11+, `SchedulerParameters=requeue_delay=N`): Slurm's hold on every requeued job, shortened
  (24.11 accepts the option and ignores it).
- health_check_reboot_only (26.05+, `HealthCheckNodeState=REBOOT_ONLY`): slurmd runs HealthCheckProgram when a
  node comes back from a reboot, before it takes jobs. Said, not used yet: the controller's gate cannot read that
  program's verdict (it only leaves a mark when it fails), and a slurmd restarted with `-b` (the devcluster's
  reboot) does not run it on 26.05.5 (tried with HealthCheckInterval 0 and 60): only a reboot slurmctld issued may.
- reboot_force (26.05+): `scontrol reboot FORCE` requeues the node's jobs and reboots it at once (26.05.5: an
  ALLOCATED node went REBOOT_ISSUED within 2 s, its job PENDING; `ASAP` waits for the job). Said, not used: the
  reboot provider acts only on nodes without jobs (the controller waits for them, then forces the node DOWN), and
  `ASAP` on a DOWN node is issued within 5 s on 22.05 and 26.05 alike.
- metrics_endpoint (25.11+, `MetricsType=metrics/openmetrics`, unless `CommunicationParameters=disable_http`):
  slurmctld answers `GET /metrics/{jobs,nodes,partitions,scheduler}` on its own port. Without MetricsType 26.05.5
  still lists the endpoints at `/metrics` and answers each with nothing. Its gauges (26.05.5) are job, node and
  scheduler counts, threads and cycle times: no count of RPCs by type (`sdiag` has those).
Not a feature of a newer release, though issue 35 took it for one: SIGTERM, then SIGKILL KillWait seconds later, to
the other tasks of a step when one fails under `--kill-on-bad-exit`. 22.05.8 and 26.05.5 both do it (measured
here: TERM 0.03 s / 0.08 s after the failed task, the step killed 5 s later with KillWait=5), so hpresilience.torch's
SIGTERM notice serves every release alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpresilience.slurm import parse

EXPEDITE_FLAG = "--requeue=expedite"
_NO_VALUE = ("", "(null)", "none")


def _options(config: Mapping[str, str], key: str) -> str:
    value = config.get(key, "").strip()
    return "" if value in _NO_VALUE else value


@dataclass(frozen=True)
class SlurmFeatures:
    """What this cluster's Slurm offers of its own resilience features (all off for 22.05 and 24.11)."""

    version: str = ""
    expedited_requeue: bool = False
    requeue_delay_s: int | None = None
    health_check_reboot_only: bool = False
    reboot_force: bool = False
    metrics_endpoint: bool = False

    def names(self) -> list[str]:
        """The features present, by name (what the events and `hpresilience status` list)."""
        out = [
            name
            for name in ("expedited_requeue", "health_check_reboot_only", "reboot_force", "metrics_endpoint")
            if getattr(self, name)
        ]
        if self.requeue_delay_s is not None:
            out.append(f"requeue_delay={self.requeue_delay_s}s")
        return out

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> SlurmFeatures:
        """Back from to_json (the controller's state file): a value of the wrong type counts as absent."""

        def count(key: str) -> int | None:
            v = data.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        flags = {f.name: data.get(f.name) is True for f in dataclasses.fields(cls) if f.type in ("bool", bool)}
        version = data.get("version")
        return cls(
            version=version if isinstance(version, str) else "",
            requeue_delay_s=count("requeue_delay_s"),
            **flags,
        )


def parse_features(version: tuple[int, int, int], config: Mapping[str, str]) -> SlurmFeatures:
    """The features of a Slurm of `version` whose `scontrol show config` reads as `config`. A setting counts only
    on a release that honours it: 24.11 accepts `requeue_delay` and still holds a requeued job 121 s."""
    ctld = _options(config, "SlurmctldParameters")
    sched = _options(config, "SchedulerParameters")
    comm = _options(config, "CommunicationParameters")
    new = version >= (25, 11, 0)
    newest = version >= (26, 5, 0)
    delay = parse.option_value(sched, "requeue_delay") if new else None
    return SlurmFeatures(
        version=f"{version[0]}.{version[1]:02d}.{version[2]}",
        expedited_requeue=new and parse.option_value(ctld, "enable_expedited_requeue") is not None,
        requeue_delay_s=int(delay) if delay is not None and delay.isascii() and delay.isdigit() else None,
        health_check_reboot_only=newest and "REBOOT_ONLY" in config.get("HealthCheckNodeState", "").upper(),
        reboot_force=newest,
        metrics_endpoint=new
        and "openmetrics" in _options(config, "MetricsType")
        and parse.option_value(comm, "disable_http") is None,
    )


def job_requeue_expedited(details: Mapping[str, str]) -> bool:
    """Whether the job (its `scontrol show job -o` key/values) was submitted with `--requeue=expedite`: 25.11+
    print `ExpeditedRequeue=Yes` for it and nothing for other jobs."""
    return details.get("ExpeditedRequeue", "").strip().lower() == "yes"
