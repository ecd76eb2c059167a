"""The job's own processes on its nodes, seen through one short task per node beside the running step
(srun --overlap): kill what earlier steps left, find slurmstepds still ending an old step, count a step's
tasks, and probe a hung step for evidence. The scripts and the readers of their output are in nodescripts.py.
"""

from __future__ import annotations

from hpresilience.errors import SlurmTimeout
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.nodescripts import (
    LIVE_SCRIPT,
    PROBE_SCRIPT,
    REAP_SCRIPT,
    STEPD_SCRIPT,
    StaleTask,
    parse_live_lines,
    parse_stale_lines,
    parse_stepd_lines,
)
from hpresilience.slurm.runner import Result
from hpresilience.slurm.steps import overlap_srun

log = get_logger("hpresilience.slurm")


def reap_marked_processes(
    client: SlurmClient, job_id: int, nodes: list[str], marker: str, env: dict[str, str], timeout: float = 10.0
) -> tuple[list[StaleTask], list[str]]:
    """Run one short task per node (sharing the job's resources, --overlap) that kills what is left of
    earlier steps: processes carrying `marker` (NAME=VALUE) in their environment. Returns what it killed
    and the nodes that did not report back (their processes could not be checked)."""
    if not nodes:
        return [], []
    args = [
        *overlap_srun(job_id, nodes, "hpr-reap"),
        "sh",
        "-c",
        REAP_SCRIPT,
        "hpr-reap",
        marker,
    ]
    try:
        res = client.runner.run(*args, timeout=timeout, check=False, retry=False, env=env)
    except SlurmTimeout:
        return [], list(nodes)
    killed, unchecked = parse_stale_lines(res.stdout, nodes)
    if unchecked:
        log.warning("reap_unanswered", nodes=",".join(unchecked), rc=res.returncode, stderr=res.stderr[-300:])
    return killed, unchecked


def lingering_steps(
    client: SlurmClient, job_id: int, nodes: list[str], env: dict[str, str], timeout: float = 5.0
) -> tuple[set[str], list[str]]:
    """The nodes where a slurmstepd of an earlier step of the job still runs, and the nodes that did not report
    back. A node that left the job and came back is still ending the job there until its old steps are gone,
    and meanwhile slurmd kills every new step of the job it is sent."""
    if not nodes:
        return set(), []
    args = [
        *overlap_srun(job_id, nodes, "hpr-stepd"),
        "sh",
        "-c",
        STEPD_SCRIPT,
        "hpr-stepd",
        str(job_id),
    ]
    try:
        res = client.runner.run(*args, timeout=timeout, check=False, retry=False, env=env)
    except SlurmTimeout:
        return set(), list(nodes)
    busy, reported = parse_stepd_lines(res.stdout)
    return busy, [n for n in nodes if n not in reported]


def probe_marked_processes(
    client: SlurmClient,
    job_id: int,
    nodes: list[str],
    marker: str,
    signals: dict[str, list[tuple[int, int]]],
    env: dict[str, str],
    timeout: float,
) -> dict[str, str | None]:
    """Run the probe on every node at once (one --overlap task each), each bounded by `timeout`: the raw
    report per node, None for a node that did not answer in time. `signals[node]`: (pid, signal) to send.

    One srun per node, not one for all: when the launch fails on one node (its slurmd gone) srun aborts the whole
    step (`Application launch failed`, then slurm_step_launch_abort: launch_slurm.c), and a node whose slurmd is
    wedged holds every node's launch for MessageTimeout; the other nodes would then look unanswering, and the
    attribution blames a node that does not answer. A probe runs only after a hang is declared."""
    from concurrent.futures import ThreadPoolExecutor

    def probe(node: str) -> str | None:
        pairs = [f"{pid}:{sig}" for pid, sig in signals.get(node, [])]
        try:
            res = client.runner.run(
                *overlap_srun(job_id, [node], "hpr-hang-probe"),
                "sh",
                "-c",
                PROBE_SCRIPT,
                "hpr-probe",
                marker,
                *pairs,
                timeout=timeout,
                check=False,
                retry=False,
                env=env,
            )
        except SlurmTimeout:
            return None
        return res.stdout if f"hpr-probed {node}" in res.stdout else None

    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(nodes)), thread_name_prefix="hpr-probe") as pool:
        return dict(zip(nodes, pool.map(probe, nodes), strict=True))


def _live_script(
    client: SlurmClient,
    job_id: int,
    nodes: list[str],
    marker: str,
    attempt: int,
    mode: str,
    env: dict[str, str],
    timeout: float,
) -> Result | None:
    args = [
        *overlap_srun(job_id, nodes, f"hpr-{mode}"),
        "sh",
        "-c",
        LIVE_SCRIPT,
        "hpr-live",
        marker,
        str(attempt),
        mode,
    ]
    try:
        return client.runner.run(*args, timeout=timeout, check=False, retry=False, env=env)
    except SlurmTimeout:
        return None


def step_task_counts(
    client: SlurmClient, job_id: int, nodes: list[str], marker: str, attempt: int, env: dict[str, str], timeout: float
) -> dict[str, int] | None:
    """How many task processes of attempt `attempt` each node still runs: one short task per node in a single
    srun (--overlap; one step for the whole job, whatever its size). None when a node did not report in time
    (its tasks could not be counted)."""
    if not nodes:
        return {}
    res = _live_script(client, job_id, nodes, marker, attempt, "count", env, timeout)
    counts = parse_live_lines(res.stdout) if res is not None else {}
    return counts if all(n in counts for n in nodes) else None


def reap_escaped_processes(
    client: SlurmClient, job_id: int, nodes: list[str], marker: str, env: dict[str, str], timeout: float
) -> tuple[list[StaleTask], list[str]]:
    """Kill the marked processes on `nodes` that escaped their step (no slurmstepd above them), while the step's
    srun (under the batch step) lives on: what it killed, and the nodes that did not report back."""
    if not nodes:
        return [], []
    res = _live_script(client, job_id, nodes, marker, 0, "reap", env, timeout)
    return parse_stale_lines(res.stdout, nodes) if res is not None else ([], list(nodes))
