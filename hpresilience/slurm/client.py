"""SlurmClient: every operation the project performs on Slurm, over its commands.

Reads use JSON: `sinfo --json` / `squeue --json` on Slurm 22.05 (its scontrol has no --json), and
`scontrol --json show node|job` on 23.02 and newer. Writes use `scontrol update`. Writes to a
running job can be refused transiently; the runner retries them and the caller re-reads the job
rather than trusting an exit code.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from hpresilience.errors import ConfigError, SlurmError, SlurmTimeout
from hpresilience.log import get_logger
from hpresilience.slurm import parse
from hpresilience.slurm.hostlist import compress
from hpresilience.slurm.models import Job, Node
from hpresilience.slurm.runner import CommandRunner
from hpresilience.waiting import wait_for

if TYPE_CHECKING:
    from hpresilience.config import SlurmSettings

log = get_logger("hpresilience.slurm")

NodeAction = Literal["fail", "drain", "down", "resume", "undrain"]
NODE_ACTIONS: tuple[str, ...] = ("fail", "drain", "down", "resume", "undrain")


class SlurmClient:
    def __init__(self, runner: CommandRunner | None = None) -> None:
        self.runner = runner or CommandRunner()

    @classmethod
    def from_settings(cls, settings: SlurmSettings, env: Mapping[str, str] | None = None) -> SlurmClient:
        return cls(CommandRunner(settings.bin_dir, settings.command_timeout_s, settings.retries,
                                 settings.retry_backoff_s, env))

    # -- what Slurm is this -------------------------------------------------------------------------
    @cached_property
    def version(self) -> tuple[int, int, int]:
        return parse.parse_version(self.runner.run("scontrol", "--version").stdout)

    @property
    def scontrol_has_json(self) -> bool:
        # `scontrol --json` arrived in 23.02; 22.05 answers "unrecognized option '--json'".
        return self.version >= (23, 2, 0)

    def config(self) -> dict[str, str]:
        return parse.parse_key_values(self.runner.run("scontrol", "show", "config").stdout)

    def accounting_enabled(self) -> bool:
        """Whether slurmctld stores accounting (slurmdbd). Without it, Slurm refuses every update of a running
        job after its first resize, so callers must not plan on a second one."""
        return self.config().get("AccountingStorageType", "accounting_storage/none") != "accounting_storage/none"

    def permits_job_expansion(self) -> bool:
        params = self.config().get("SchedulerParameters", "")
        return "permit_job_expansion" in params.split(",")

    # -- nodes ---------------------------------------------------------------------------------------
    def nodes(self, names: Iterable[str] | None = None) -> list[Node]:
        """All nodes (one query), optionally filtered to `names` in that order."""
        if self.scontrol_has_json:
            res = self.runner.run("scontrol", "--json", "show", "node")
            nodes = parse.parse_nodes_json(res.stdout, "scontrol --json show node")
        else:
            res = self.runner.run("sinfo", "--json")
            nodes = parse.parse_nodes_json(res.stdout, "sinfo --json")
        if names is None:
            return nodes
        wanted = list(names)
        by_name = {n.name: n for n in nodes}
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise SlurmError(["sinfo", "--json"], 0, "", f"unknown node(s): {', '.join(missing)}")
        return [by_name[n] for n in wanted]

    def node(self, name: str) -> Node:
        return self.nodes([name])[0]

    def set_node_state(self, names: Iterable[str], action: NodeAction | str, reason: str = "") -> None:
        """`scontrol update nodename=... state=<action> reason=...`; fail/drain/down need a reason."""
        if action not in NODE_ACTIONS:
            raise ConfigError(f"unknown node action {action!r}; known: {', '.join(NODE_ACTIONS)}")
        hosts = compress(names)
        if not hosts:
            return
        args = ["update", f"nodename={hosts}", f"state={action.upper()}"]
        if action in ("fail", "drain", "down"):
            if not reason:
                raise ConfigError(f"setting nodes {action} needs a reason")
            args.append(f"reason={reason}")
        self.runner.run("scontrol", *args)
        log.info("node_state_set", nodes=hosts, state=action, reason=reason or None)

    def reboot_nodes(self, names: Iterable[str], reason: str, asap: bool = True,
                     nextstate: Literal["resume", "down"] = "resume") -> None:
        """`scontrol reboot [ASAP] nextstate=... reason=... nodes`: ASAP drains the node first."""
        hosts = compress(names)
        args = ["reboot"] + (["ASAP"] if asap else []) + [f"nextstate={nextstate.upper()}", f"reason={reason}", hosts]
        self.runner.run("scontrol", *args)
        log.info("node_reboot_requested", nodes=hosts, reason=reason, asap=asap)

    # -- jobs ----------------------------------------------------------------------------------------
    def jobs(self) -> list[Job]:
        if self.scontrol_has_json:
            return parse.parse_jobs_json(self.runner.run("scontrol", "--json", "show", "job").stdout)
        # 22.05's squeue --json ignores -j and other filters: we always get every job it knows.
        return parse.parse_jobs_json(self.runner.run("squeue", "--json").stdout, "squeue --json")

    def job(self, job_id: int) -> Job:
        for j in self.jobs():
            if j.job_id == job_id:
                return j
        raise SlurmError(["squeue", "--json"], 0, "", f"job {job_id} is not known to Slurm")

    def job_or_none(self, job_id: int) -> Job | None:
        try:
            return self.job(job_id)
        except SlurmError as err:
            if "is not known" in str(err):
                return None
            raise

    def wait_running(self, job_id: int, timeout: float = 60.0) -> Job:
        """Wait (with progress) until the job runs; fails fast if it ends instead."""
        def probe() -> Job | None:
            j = self.job(job_id)
            if j.is_finished:
                raise SlurmError(["squeue"], 0, "", f"job {job_id} ended ({j.state}) before it ran")
            return j if j.is_running else None
        return wait_for(probe, f"job {job_id} to start running", timeout)

    def sbatch(self, *args: str, env: Mapping[str, str] | None = None) -> int:
        return parse.parse_job_id(self.runner.run("sbatch", "--parsable", *args, env=env).stdout)

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        args = [str(job_id)] + ([f"--signal={signal}"] if signal else [])
        self.runner.run("scancel", *args)

    def requeue(self, job_id: int) -> None:
        self.runner.run("scontrol", "requeue", str(job_id))
        log.info("job_requeued", job_id=job_id)

    # -- resizing ------------------------------------------------------------------------------------
    def _update_job(self, job_id: int, *settings: str) -> None:
        # scontrol writes slurm_job_<id>_resize.sh into its cwd when SLURM_JOBID is set: keep that out of
        # the user's directory by running in a private temporary one.
        with tempfile.TemporaryDirectory(prefix="hpr-scontrol-") as tmp:
            self.runner.run("scontrol", "update", f"jobid={job_id}", *settings, cwd=tmp)

    def shrink_job(self, job_id: int, keep: Iterable[str], timeout: float = 30.0) -> Job:
        """Release every node of the job except `keep`; returns the job as Slurm then reports it."""
        keep_list = list(keep)
        if not keep_list:
            raise ConfigError(f"shrinking job {job_id} to no nodes would end it; refusing")
        target = set(keep_list)
        try:
            self._update_job(job_id, f"NodeList={compress(keep_list)}")
        except SlurmError:
            if set(self.job(job_id).nodes) != target:
                raise
        job = wait_for(lambda: (j if set((j := self.job(job_id)).nodes) == target else None),
                       f"job {job_id} to shrink to {compress(keep_list)}", timeout)
        log.info("job_shrunk", job_id=job_id, nodes=compress(job.nodes))
        return job

    def grow_job(self, job_id: int, count: int = 1, nodes: Iterable[str] | None = None,
                 exclude: Iterable[str] | None = None, timeout: float = 60.0) -> Job:
        """Add `count` nodes to a running job with Slurm's expand dependency:
        salloc a helper job with --dependency=expand:J, move its nodes into J (NumNodes=0), then
        NumNodes=ALL on J. Needs SchedulerParameters=permit_job_expansion (probe with permits_job_expansion)."""
        job = self.job(job_id)
        if not job.is_running:
            raise SlurmError(["grow"], None, "", f"job {job_id} is {job.state}, only a running job can grow")
        name = f"hpr-grow-{job_id}"
        args = ["--no-shell", f"--nodes={count}", f"--job-name={name}", f"--dependency=expand:{job_id}"]
        if job.partition:
            args.append(f"--partition={job.partition}")
        wanted = list(nodes or [])
        if wanted:
            args.append(f"--nodelist={compress(wanted)}")
        excl = list(exclude or [])
        if excl:
            args.append(f"--exclude={compress(excl)}")
        try:
            res = self.runner.run("salloc", *args, timeout=timeout, retry=False)
        except SlurmTimeout:
            self._cancel_by_name(name)
            raise
        except SlurmError:
            self._cancel_by_name(name)
            raise
        helper = parse.parse_job_id(res.stderr + res.stdout)
        try:
            # Moving the helper's nodes into J is what grows J. The FAQ's follow-up `NumNodes=ALL` on J only
            # rewrites slurm_job_J_resize.sh; with accounting_storage/none a resized job answers it with
            # "DB index is being set, try again" for good, and we recompute the environment ourselves.
            self._update_job(helper, "NumNodes=0")
        finally:
            try:
                self.cancel(helper)
            except SlurmError:
                pass  # already gone once its nodes moved: that is the normal case
        before = set(job.nodes)
        grown = wait_for(lambda: (j if len(set((j := self.job(job_id)).nodes) - before) >= count else None),
                         f"job {job_id} to take over the nodes of helper job {helper}", timeout)
        log.info("job_grown", job_id=job_id, nodes=compress(grown.nodes), added=compress(set(grown.nodes) - before))
        return grown

    def _cancel_by_name(self, name: str) -> None:
        for j in self.jobs():
            if j.name == name and not j.is_finished:
                try:
                    self.cancel(j.job_id)
                except SlurmError:
                    pass


def client_for(settings: SlurmSettings, slurm_conf: str | None = None) -> SlurmClient:
    """A client whose commands see `slurm_conf` (e.g. a devcluster's) as SLURM_CONF."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return SlurmClient.from_settings(settings, env)
