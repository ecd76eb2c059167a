"""SlurmClient: every operation the project performs on Slurm, over its commands.

Reads name what they want: `scontrol show node NAMES -o` / `scontrol show job J -o` on Slurm 22.05 (its
scontrol has no --json, and its sinfo/squeue --json ignore filters), `scontrol --json show node|job` on 23.02
and newer; the whole table (`sinfo --json`) only when asked for every node. Writes use `scontrol update`. Writes to a
running job can be refused transiently; the runner retries them and the caller re-reads the job
rather than trusting an exit code.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from hpresilience.errors import ConfigError, SlurmError, SlurmTimeout, UnknownNode
from hpresilience.log import get_logger
from hpresilience.slurm import parse, parsejson
from hpresilience.slurm.features import SlurmFeatures, parse_features
from hpresilience.slurm.hostlist import compress
from hpresilience.slurm.models import Job, Node, ReasonGroup
from hpresilience.slurm.runner import CommandRunner, Result
from hpresilience.waiting import wait_for

if TYPE_CHECKING:
    from hpresilience.slurm.settings import SlurmSettings

log = get_logger("hpresilience.slurm")
# What scontrol answers (exit 1) for names it does not know: an answer, not a failure to retry.
_NODE_NOT_FOUND = re.compile(r"^Node \S+ not found|Invalid node name", re.IGNORECASE | re.MULTILINE)
_JOB_UNKNOWN = re.compile(r"Invalid job id", re.IGNORECASE)

NodeAction = Literal["fail", "drain", "down", "resume", "undrain"]
NODE_ACTIONS: tuple[str, ...] = ("fail", "drain", "down", "resume", "undrain")


class SlurmClient:
    def __init__(self, runner: CommandRunner | None = None) -> None:
        self.runner = runner or CommandRunner()

    @classmethod
    def from_settings(cls, settings: SlurmSettings, env: Mapping[str, str] | None = None) -> SlurmClient:
        return cls(
            CommandRunner(settings.bin_dir, settings.command_timeout_s, settings.retries, settings.retry_backoff_s, env)
        )

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
        # 22.05 prints accounting_storage/none; 24.11 and 26.05 print (null) (their accounting_storage/none is gone).
        kind = self.config().get("AccountingStorageType", "").strip()
        return kind not in ("", "(null)", "none", "accounting_storage/none")

    def features(self) -> SlurmFeatures:
        """Slurm's own resilience features (slurm/features.py): two reads; call once at start and keep the answer."""
        return parse_features(self.version, self.config())

    def requeue_delay_s(self) -> int | None:
        """Seconds Slurm itself holds a requeued job where the site shortened the hold
        (`SchedulerParameters=requeue_delay=N`, honoured from 25.11: 26.05.5 ran a requeued job again within 4 s
        with N=2, while 24.11.5 accepts the option and still holds it 121 s). None: Slurm's default hold,
        cred_expire + 1 s."""
        if self.version < (25, 11, 0):
            return None
        return parse_features(self.version, self.config()).requeue_delay_s

    def rpc_stats(self) -> dict[str, tuple[int, int]]:
        """slurmctld's own count and total microseconds per RPC type (`sdiag`; root or an operator). slurmctld's
        /metrics (25.11+) has no such counts (26.05.5), so benches read these on every release."""
        return parse.parse_rpc_stats(self.runner.run("sdiag").stdout)

    def permits_job_expansion(self) -> bool:
        params = self.config().get("SchedulerParameters", "")
        return "permit_job_expansion" in params.split(",")

    # -- nodes ---------------------------------------------------------------------------------------
    # Every per-node and per-job read names what it wants, so its output (and the client's cost) grows with
    # the question, not with the cluster: on 22.05 only scontrol's text form filters (sinfo/squeue --json
    # ignore their filters), on 23.02+ `scontrol --json show node NAMES` does. Only `nodes()` without names,
    # `jobs()` and `node_count()` read the whole table.
    def nodes(self, names: Iterable[str] | None = None) -> list[Node]:
        """With `names`: those nodes in that order, read with one query sized by the names (an unknown name
        is a SlurmError). Without: every node of the cluster (one full-table query)."""
        if names is None:
            if self.scontrol_has_json:
                res = self.runner.run("scontrol", "--json", "show", "node")
                return parsejson.parse_nodes_json(res.stdout, "scontrol --json show node")
            return parsejson.parse_nodes_json(self.runner.run("sinfo", "--json").stdout, "sinfo --json")
        wanted = list(names)
        by_name, read = self._read_nodes(wanted)
        missing = [n for n in dict.fromkeys(wanted) if n not in by_name]
        if missing:
            # The error names the query that ran (an error naming another misleads whoever re-runs it).
            raise UnknownNode(
                read.argv if read else ("scontrol", "show", "node"),
                read.returncode if read else None,
                read.stderr if read else "",
                f"unknown node(s): {', '.join(missing)}",
            )
        return [by_name[n] for n in wanted]

    def node(self, name: str) -> Node:
        return self.nodes([name])[0]

    def known_nodes(self, names: Iterable[str]) -> list[Node]:
        """Those of `names` that Slurm knows, in that order; unknown names are left out, not an error."""
        wanted = list(names)
        by_name, _ = self._read_nodes(wanted)
        return [by_name[n] for n in wanted if n in by_name]

    def nodes_out_of_service(self, also: Iterable[str] = ()) -> list[Node]:
        """Nodes that are down, drained, failed or failing (`sinfo -R` filters on the states down, fail and
        drain, with or without a reason), plus those of `also` that Slurm knows: two queries whose output
        grows with the nodes in trouble, not with the cluster."""
        res = self.runner.run("sinfo", "-h", "-N", "-R", "-o", "%N")
        names = list(dict.fromkeys(parse.parse_node_names(res.stdout) + list(also)))
        return self.known_nodes(names)

    def node_count(self) -> int:
        """How many nodes the cluster has (`sinfo -a -o %D`: a node in several partitions counts once)."""
        res = self.runner.run("sinfo", "-h", "-a", "-o", "%D")
        return sum(int(w) for w in res.stdout.split() if w.isdigit())

    def reason_groups(self, partitions: Iterable[str] = ()) -> list[ReasonGroup]:
        """The partitions' nodes grouped by reason (every partition when none is named): one query whose
        output grows with the distinct reasons in those partitions, not with their size (agent's fleet ceiling)."""
        names = ",".join(dict.fromkeys(p for p in partitions if p))
        args = ["-h"] + ([f"--partition={names}"] if names else []) + ["-o", parse.REASON_GROUP_FORMAT]
        return parse.parse_reason_groups(self.runner.run("sinfo", *args).stdout)

    def idle_nodes(self, partition: str = "") -> list[str]:
        """Names of the nodes that could take a job now (idle, no flag), optionally of one partition."""
        args = ["-h", "-N", "-t", "idle", "-o", "%N|%t"] + ([f"--partition={partition}"] if partition else [])
        return parse.parse_idle_names(self.runner.run("sinfo", *args).stdout)

    def _read_nodes(self, names: list[str]) -> tuple[dict[str, Node], Result | None]:
        """The named nodes Slurm knows, and the command's result (None when no name was asked)."""
        hosts = compress(dict.fromkeys(names))
        if not hosts:
            return {}, None
        if self.scontrol_has_json:
            args, what = ["--json", "show", "node", hosts], "scontrol --json show node"
        else:
            args, what = ["show", "node", hosts, "-o"], "scontrol show node -o"
        res = self._run_allowing(_NODE_NOT_FOUND, "scontrol", *args)
        text = _NODE_NOT_FOUND.sub("", res.stdout) if res.returncode else res.stdout
        if not text.strip():
            nodes: list[Node] = []
        elif self.scontrol_has_json:
            try:
                nodes = parsejson.parse_nodes_json(text, what)
            except SlurmError:
                if res.returncode == 0:
                    raise
                nodes = []  # only unknown names asked: an error object and no `nodes` list
        else:
            nodes = parse.parse_nodes_oneliner(text, what)
        # Filtered on our side too: Slurm may answer a list of names with more than was asked.
        wanted = set(names)
        return {n.name: n for n in nodes if n.name in wanted}, res

    def _run_allowing(self, answer: re.Pattern[str], tool: str, *args: str) -> Result:
        """Run once without failing on `answer` (e.g. "Node x not found": a fact, not an error); any other
        failure goes through the runner's retries and raises."""
        res = self.runner.run(tool, *args, check=False)
        if res.returncode == 0 or answer.search(res.stderr + res.stdout):
            return res
        return self.runner.run(tool, *args)

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

    def reboot_nodes(
        self, names: Iterable[str], reason: str, asap: bool = True, nextstate: Literal["resume", "down"] = "resume"
    ) -> None:
        """`scontrol reboot [ASAP] nextstate=... reason=... nodes`: ASAP drains the node first."""
        hosts = compress(names)
        args = ["reboot"] + (["ASAP"] if asap else []) + [f"nextstate={nextstate.upper()}", f"reason={reason}", hosts]
        self.runner.run("scontrol", *args)
        log.info("node_reboot_requested", nodes=hosts, reason=reason, asap=asap)

    def set_node_address(self, name: str, address: str, hostname: str = "") -> None:
        """Point node `name` at a replacement machine: `scontrol update nodename=X nodeaddr=A [nodehostname=H]`.
        The Slurm name stays; only where slurmctld reaches it changes (an EC2 replacement has a new private IP)."""
        args = ["update", f"nodename={name}", f"nodeaddr={address}"]
        if hostname:
            args.append(f"nodehostname={hostname}")
        self.runner.run("scontrol", *args)
        log.info("node_address_set", node=name, address=address, hostname=hostname or None)

    # -- jobs ----------------------------------------------------------------------------------------
    def jobs(self) -> list[Job]:
        """Every job slurmctld knows (one full-queue query)."""
        if self.scontrol_has_json:
            return parsejson.parse_jobs_json(self.runner.run("scontrol", "--json", "show", "job").stdout)
        # 22.05's squeue --json ignores -j and other filters: we always get every job it knows.
        return parsejson.parse_jobs_json(self.runner.run("squeue", "--json").stdout, "squeue --json")

    def job(self, job_id: int) -> Job:
        """One job, read with a query of that job only (`scontrol show job J`)."""
        return self._known_job(job_id)[0]

    def job_or_none(self, job_id: int) -> Job | None:
        return self._read_job(job_id)[0]

    def _read_job(self, job_id: int) -> tuple[Job | None, Result]:
        if self.scontrol_has_json:
            res = self._run_allowing(_JOB_UNKNOWN, "scontrol", "--json", "show", "job", str(job_id))
            jobs = parsejson.parse_jobs_json(res.stdout, "scontrol --json show job") if res.returncode == 0 else []
        else:
            res = self._run_allowing(_JOB_UNKNOWN, "scontrol", "show", "job", str(job_id), "-o")
            jobs = parse.parse_jobs_oneliner(res.stdout) if res.returncode == 0 else []
        return next((j for j in jobs if j.job_id == job_id), None), res

    def _known_job(self, job_id: int) -> tuple[Job, Result]:
        """The job and the read that found it; an unknown job is a SlurmError naming that read."""
        job, res = self._read_job(job_id)
        if job is None:
            raise SlurmError(res.argv, res.returncode, res.stderr, f"job {job_id} is not known to Slurm")
        return job, res

    def wait_running(self, job_id: int, timeout: float = 60.0) -> Job:
        """Wait (with progress) until the job runs; fails fast if it ends instead."""

        def probe() -> Job | None:
            j, res = self._known_job(job_id)
            if j.is_finished:
                raise SlurmError(res.argv, res.returncode, "", f"job {job_id} ended ({j.state}) before it ran")
            return j if j.is_running else None

        return wait_for(probe, f"job {job_id} to start running", timeout)

    def sbatch(self, *args: str, env: Mapping[str, str] | None = None) -> int:
        return parse.parse_job_id(self.runner.run("sbatch", "--parsable", *args, env=env).stdout)

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        args = [str(job_id)] + ([f"--signal={signal}"] if signal else [])
        self.runner.run("scancel", *args)

    def cancel_jobs_of(self, user: str) -> None:
        """Cancel every running, pending or suspended job of `user`, batch scripts and steps alike (--full)."""
        self.runner.run("scancel", "--full", "--quiet", "--state=RUNNING,PENDING,SUSPENDED", f"--user={user}")

    def requeue(self, job_id: int) -> None:
        self.runner.run("scontrol", "requeue", str(job_id))
        log.info("job_requeued", job_id=job_id)

    # -- resizing ------------------------------------------------------------------------------------
    def _update_job(self, job_id: int, *settings: str) -> None:
        # A resize run where SLURM_JOBID is set (the wrapper runs inside the job) makes scontrol write
        # slurm_job_<id>_resize.{sh,csh} into its cwd, the user's directory, for a shell to source; nothing here
        # sources them, and without SLURM_JOBID scontrol writes none (update_job.c, 22.05-26.05). A private
        # temporary directory for them stayed behind in /tmp whenever the wrapper was killed mid-update.
        self.runner.run("scontrol", "update", f"jobid={job_id}", *settings, unset=("SLURM_JOBID",))

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
        job = wait_for(
            lambda: j if set((j := self.job(job_id)).nodes) == target else None,
            f"job {job_id} to shrink to {compress(keep_list)}",
            timeout,
        )
        log.info("job_shrunk", job_id=job_id, nodes=compress(job.nodes))
        return job

    def grow_job(
        self,
        job_id: int,
        count: int = 1,
        nodes: Iterable[str] | None = None,
        exclude: Iterable[str] | None = None,
        timeout: float = 60.0,
    ) -> Job:
        """Add `count` nodes to a running job with Slurm's expand dependency:
        salloc a helper job with --dependency=expand:J, move its nodes into J (NumNodes=0), then
        NumNodes=ALL on J. Needs SchedulerParameters=permit_job_expansion (probe with permits_job_expansion)."""
        job, read = self._known_job(job_id)
        if not job.is_running:
            raise SlurmError(
                read.argv, read.returncode, "", f"job {job_id} is {job.state}, only a running job can grow"
            )
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
        grown = wait_for(
            lambda: j if len(set((j := self.job(job_id)).nodes) - before) >= count else None,
            f"job {job_id} to take over the nodes of helper job {helper}",
            timeout,
        )
        log.info("job_grown", job_id=job_id, nodes=compress(grown.nodes), added=compress(set(grown.nodes) - before))
        return grown

    def _cancel_by_name(self, name: str) -> None:
        # squeue's text form honours --name (its --json would read the whole queue). `--me`: a name is anyone's to
        # choose, and another user's job of that name is not ours to cancel (issue 31).
        res = self.runner.run("squeue", "-h", "--me", f"--name={name}", "-o", "%i", check=False)
        for word in res.stdout.split():
            if word.isdigit():
                try:
                    self.cancel(int(word))
                except SlurmError:
                    pass


def client_for(settings: SlurmSettings, slurm_conf: str | None = None) -> SlurmClient:
    """A client whose commands see `slurm_conf` (e.g. a devcluster's) as SLURM_CONF."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return SlurmClient.from_settings(settings, env)
