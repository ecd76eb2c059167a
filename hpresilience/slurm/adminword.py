"""The admin word: how the one controller tells a running job that nodes under it were marked bad (and that it is
watched). It is the project's one word in a job's AdminComment; "notice" is kept for what a cloud sends a node
(a reclaim, a maintenance event) and for the wrapper's word to the ranks (a planned move).

A node query costs slurmctld its whole node table whatever the filter (~10 ms at 10,000 nodes on 22.05), a
job query costs the job (~0.3 ms). So no job polls node state: the controller, which reads the nodes out of
service cluster-wide anyway, writes one word into the AdminComment of each job running on a bad node:

    hpr:bad=n2@1764090077,n5@1764090079      (node @ the time its reason was set, epoch seconds)

and the wrapper reads its own job once a poll. AdminComment is writable only by an operator or admin
(`scontrol update jobid=J AdminComment=...`), so a user cannot forge an admin word onto another user's job; the
rest of a site's AdminComment is kept byte for byte. AdminComment is read exactly, as a field of its own
(slurm/exact.py): `scontrol --json show job J` on 23.02+; on 22.05 `squeue -h -t all -j J -O JobID,admin_comment`,
framed by a mark made for that query. Never from scontrol's text forms: a JobName, WorkDir, Command or Comment
holding a newline and `AdminComment=...` prints a line that looks like the field, and the controller would write
the user's text back into the site's field as root (issue 31).

Reading its own job every second still cost slurmctld ~0.4 ms per job-second. So the controller also tells each
running batch job that it is watched, with a lease (`hpr:watch=<until, epoch seconds>`, renewed long before it
runs out), and nudges the job's batch step once per bad-node word (`nudge`: SIGWINCH through `scancel --full
--batch`, which reaches the wrapper and the batch shell, never the tasks of a step). A wrapper that saw the lease
and got the nudge it sent itself reads its job only when nudged, and rarely as a safety net
(autoresume/watch/nodewatch.py). The jobs to watch come from slurmdbd (`sacct -s R`), never from slurmctld's queue.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hpresilience.errors import SlurmParseError
from hpresilience.reasons import parse_reason
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.exact import json_job, json_text, record_mark, suffix_framed
from hpresilience.slurm.hostlist import compress, expand
from hpresilience.slurm.models import Node

BAD_PREFIX = "hpr:bad="
WATCH_PREFIX = "hpr:watch="
# The nudge: SIGWINCH, ignored by default by every process that does not ask for it (bash, python, torchrun,
# srun without --pty), and by number because scancel knows it by no name ("Unknown job signal: WINCH").
NUDGE_SIGNAL = int(signal.SIGWINCH)
_HARD_STATES = frozenset({"FAIL", "DOWN", "NOT_RESPONDING"})


def leaves_step(node: Node) -> bool:
    """Whether a step on `node` must stop: Slurm or the agent says the node is broken, or its reason asks for
    an action. The wrapper's classifier (autoresume/classify.node_is_bad) applies the same rule when it
    confirms an admin word against the node itself."""
    if node.states & _HARD_STATES:
        return True
    return parse_reason(node.reason).action is not None and node.has("DRAIN", "FAIL", "DOWN")


def planned_move(node: Node) -> bool:
    """A node drained without a fault (operator maintenance, a cloud's reclaim or maintenance notice): the step
    moves off it at a safe point, after telling its ranks, instead of being killed at once."""
    return node.has("DRAIN") and not node.states & _HARD_STATES and not leaves_step(node)


@dataclass(frozen=True)
class AdminWord:
    """What a job's record says: its bad nodes with their mark times, and its whole AdminComment."""

    bad: Mapping[str, int]
    admin_comment: str
    found: bool = True  # False: the job is not known to Slurm (ended)
    watched_until: int = 0  # the controller's lease on watching this job (epoch seconds); 0: none


def format_bad_nodes(bad: Mapping[str, int]) -> str:
    return BAD_PREFIX + ",".join(f"{n}@{t}" for n, t in sorted(bad.items()))


def parse_bad_nodes(admin_comment: str) -> dict[str, int]:
    """The nodes named by our word in an AdminComment; words that do not parse are skipped."""
    out: dict[str, int] = {}
    for word in admin_comment.split():
        if not word.startswith(BAD_PREFIX):
            continue
        for item in word[len(BAD_PREFIX) :].split(","):
            name, _, at = item.rpartition("@")
            if name and at.isdigit():
                out[name] = int(at)
        break
    return out


def _word(prefix: str) -> re.Pattern[str]:
    return re.compile(r"(^|\s)" + re.escape(prefix) + r"\S*(?=\s|$)")


def with_word(admin_comment: str, prefix: str, word: str) -> str:
    """The AdminComment with our word of `prefix` replaced by `word` (taken off when ""); the rest kept."""
    m = _word(prefix).search(admin_comment)
    if m is None:
        if not word:
            return admin_comment
        return f"{admin_comment} {word}" if admin_comment else word
    if word:
        return admin_comment[: m.start()] + m.group(1) + word + admin_comment[m.end() :]
    if m.group(1):
        return admin_comment[: m.start()] + admin_comment[m.end() :]
    return admin_comment[m.end() + 1 :]


def with_bad_nodes(admin_comment: str, bad: Mapping[str, int]) -> str:
    """The AdminComment with our word replaced by `bad` (taken off when empty); the rest kept as it was."""
    return with_word(admin_comment, BAD_PREFIX, format_bad_nodes(bad) if bad else "")


def parse_watch(admin_comment: str) -> int:
    """The lease in our watch word (epoch seconds); 0 when there is none or it does not parse."""
    for word in admin_comment.split():
        if word.startswith(WATCH_PREFIX):
            value = word[len(WATCH_PREFIX) :]
            return int(value) if value.isdigit() else 0
    return 0


def admin_comment_format(mark: str) -> str:
    """squeue's --Format for a job's id and AdminComment, each value followed by `mark` (width 0: whole)."""
    return f"JobID:0{mark},admin_comment:0{mark}"


def parse_admin_comment(text: str, mark: str, job_id: int) -> str | None:
    """AdminComment of job `job_id` from `squeue -h -O <admin_comment_format(mark)>`; None when the answer
    does not list the job. SlurmParseError when it is not made of framed records, or lists the job twice."""
    what = "squeue -O JobID,admin_comment"
    mine = [c for j, c in suffix_framed(text, mark, 2, what) if j == str(job_id)]
    if len(mine) > 1:
        raise SlurmParseError([what], None, "", f"{what}: job {job_id} is listed {len(mine)} times")
    if not mine:
        return None
    return "" if mine[0] == "(null)" else mine[0]


def read_admin_word(client: SlurmClient, job_id: int) -> AdminWord:
    """One exact read of the job's AdminComment (a one-job query: what slurmctld pays for the job, never the
    node table). Raises SlurmError when slurmctld does not answer or the answer is not the record asked for;
    an unknown job is an AdminWord with found=False."""
    mark = "" if client.scontrol_has_json else record_mark()
    if not mark:
        argv: tuple[str, ...] = ("scontrol", "--json", "show", "job", str(job_id))
    else:
        argv = ("squeue", "-h", "-t", "all", "-j", str(job_id), "-O", admin_comment_format(mark))
    res = client.runner.run(*argv, check=False)
    if res.returncode != 0:
        if "Invalid job id" in res.stderr + res.stdout:
            return AdminWord({}, "", found=False)
        res = client.runner.run(*argv)
    if not mark:
        record = json_job(res.stdout, job_id, "scontrol --json show job")
        comment = None if record is None else json_text(record, "admin_comment")
    else:
        comment = parse_admin_comment(res.stdout, mark, job_id)
    if comment is None:
        return AdminWord({}, "", found=False)
    return AdminWord(parse_bad_nodes(comment), comment, watched_until=parse_watch(comment))


def jobs_on(client: SlurmClient, nodes: Iterable[str]) -> dict[int, set[str]]:
    """Running jobs on `nodes`, each with which of `nodes` it holds (`squeue -w`: a node-filtered query, at the
    whole table's cost; the controller asks it only when the set of bad nodes changes)."""
    wanted = set(nodes)
    hosts = compress(sorted(wanted))
    if not hosts:
        return {}
    res = client.runner.run("squeue", "-h", "-t", "R,CG,S", "-w", hosts, "-o", "%i|%N")
    out: dict[int, set[str]] = {}
    for line in res.stdout.splitlines():
        job, _, held = line.strip().partition("|")
        if job.isdigit():
            try:
                on = set(expand(held)) & wanted
            except SlurmParseError:
                continue
            if on:
                out[int(job)] = on
    return out


def write_bad_nodes(client: SlurmClient, job_id: int, bad: Mapping[str, int]) -> bool:
    """Set our word in the job's AdminComment to `bad` (root/operator only); False when the job is gone."""
    current = read_admin_word(client, job_id)
    if not current.found:
        return False
    if dict(current.bad) == dict(bad):
        return True
    client.runner.run(
        "scontrol",
        "update",
        f"jobid={job_id}",
        f"AdminComment={with_bad_nodes(current.admin_comment, bad)}",
        retry=False,
    )
    return True


def write_watch(client: SlurmClient, job_id: int, until: int) -> bool:
    """Set the job's watch lease to `until` (root/operator only); False when the job is gone."""
    current = read_admin_word(client, job_id)
    if not current.found:
        return False
    client.runner.run(
        "scontrol",
        "update",
        f"jobid={job_id}",
        f"AdminComment={with_word(current.admin_comment, WATCH_PREFIX, f'{WATCH_PREFIX}{until}')}",
        retry=False,
    )
    return True


def nudge(client: SlurmClient, job_id: int) -> bool:
    """SIGWINCH to every process of the job's batch step (`--full`: the batch shell alone otherwise), so that
    its wrapper reads its job now. One RPC; the tasks of its steps are not signalled. False: refused (no batch
    step, the job ended, not ours)."""
    res = client.runner.run(
        "scancel", f"--signal={NUDGE_SIGNAL}", "--full", "--batch", str(job_id), check=False, retry=False
    )
    return res.returncode == 0


def running_batch_jobs(client: SlurmClient) -> set[int]:
    """The jobs whose batch step runs now, from slurmdbd (`sacct -s R`: no load on slurmctld). A job without a
    batch step (salloc) is not among them: nothing could nudge its wrapper."""
    res = client.runner.run("sacct", "-a", "-n", "-P", "-s", "R", "-o", "JobIDRaw,State", retry=False)
    return parse_running_batch(res.stdout)


def parse_running_batch(text: str) -> set[int]:
    out: set[int] = set()
    for line in text.splitlines():
        job, _, state = line.strip().partition("|")
        head, _, step = job.partition(".")
        if step == "batch" and state.startswith("RUNNING") and head.isdigit():
            out.add(int(head))
    return out
