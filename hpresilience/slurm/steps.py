"""Operations on a job's steps: list them, signal them, and run short tasks on its nodes (srun --overlap).

What those tasks find of the job's own processes (reap, count, probe) is in nodeprocs.py."""

from __future__ import annotations

from dataclasses import dataclass

from hpresilience.errors import SlurmError, SlurmTimeout
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.nodescripts import NOTICE_SCRIPT, parse_notice_lines
from hpresilience.slurm.parse import parse_step_lines
from hpresilience.slurm.runner import Result

log = get_logger("hpresilience.slurm")


@dataclass(frozen=True)
class StepInfo:
    step_id: str  # "12.3"
    name: str
    nodes: tuple[str, ...]


def overlap_srun(job_id: int, nodes: list[str], name: str) -> list[str]:
    """`srun` running one task on each of `nodes` inside the job's allocation, beside its running step
    (--overlap): how the wrapper reaches every node of a step (reap, counts, notices, probes). A task that
    fails does not end the others (--kill-on-bad-exit=0)."""
    return [
        "srun",
        f"--jobid={job_id}",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        f"--nodelist={','.join(nodes)}",
        "--ntasks-per-node=1",
        "--overlap",
        "--export=ALL",
        f"--job-name={name}",
        "--kill-on-bad-exit=0",
    ]


def job_steps(client: SlurmClient, job_id: int) -> list[StepInfo]:
    """The job's live steps (`squeue -s`; unlike `squeue --json`, the text form honours -j)."""
    res = client.runner.run("squeue", "-s", "-j", str(job_id), "-h", "-o", "%i|%j|%N", check=False)
    if res.returncode != 0:
        # A job that has ended answers "Invalid job id": it has no steps left.
        if "Invalid job id" in res.stderr:
            return []
        raise SlurmError(list(res.argv), res.returncode, res.stderr)
    return [StepInfo(step_id, name, nodes) for step_id, name, nodes in parse_step_lines(res.stdout)]


def named_steps(client: SlurmClient, job_id: int, name: str) -> list[StepInfo]:
    return [s for s in job_steps(client, job_id) if s.name == name]


def signal_step(client: SlurmClient, step_id: str, signal: str | None = None, timeout: float = 5.0) -> None:
    """`scancel [--signal=SIG] J.S`: with a signal, only the tasks get it; without, the step is cancelled.
    Bounded: scancel waits for every node of the step to answer, and a dead node never does."""
    args = ([f"--signal={signal}"] if signal else []) + [step_id]
    try:
        res = client.runner.run("scancel", *args, retry=False, check=False, timeout=timeout)
    except SlurmTimeout:
        log.warning("step_signal_timed_out", step=step_id, signal=signal, timeout_s=timeout)
        return
    if res.returncode != 0:
        # e.g. "Access/permission denied", or the step is already gone: nothing was signalled.
        log.warning(
            "step_signal_refused",
            step=step_id,
            signal=signal,
            exit_code=res.returncode,
            stderr=res.stderr.strip()[:300],
        )
        return
    log.info("step_signalled" if signal else "step_cancelled", step=step_id, signal=signal)


def write_move_notice(
    client: SlurmClient,
    job_id: int,
    nodes: list[str],
    path: str,
    reason: str,
    env: dict[str, str],
    timeout: float = 10.0,
    clear: bool = False,
) -> list[str]:
    """Write (or, with clear, remove) the notice file at `path` on every node, in one step of one task per node;
    returns the nodes that did not confirm."""
    if not nodes:
        return []
    run_env = {**env, "HPR_NOTICE_FILE": path, "HPR_NOTICE_REASON": reason[:500]}
    args = [
        *overlap_srun(job_id, nodes, "hpr-notice"),
        "sh",
        "-c",
        NOTICE_SCRIPT,
        "hpr-notice",
        "clear" if clear else "write",
    ]
    try:
        res = client.runner.run(*args, timeout=timeout, check=False, retry=False, env=run_env)
    except SlurmTimeout:
        return list(nodes)
    done = parse_notice_lines(res.stdout)
    return [n for n in nodes if n not in done]


def nodes_answering(
    client: SlurmClient, job_id: int, nodes: list[str], env: dict[str, str], timeout: float = 3.0
) -> dict[str, bool]:
    """Whether each node runs a trivial task within `timeout` (one srun per node, all at once). A node
    whose slurmd is gone (kernel panic, power loss) does not, long before Slurm's SlurmdTimeout."""
    from concurrent.futures import ThreadPoolExecutor

    def alive(node: str) -> bool:
        try:
            res = client.runner.run(
                *overlap_srun(job_id, [node], "hpr-alive"),
                "echo",
                "hpr-alive",
                timeout=timeout,
                check=False,
                retry=False,
                env=env,
            )
        except SlurmTimeout:
            return False
        return res.returncode == 0 and "hpr-alive" in res.stdout

    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(nodes)), thread_name_prefix="hpr-alive") as pool:
        return dict(zip(nodes, pool.map(alive, nodes), strict=True))


def run_on_nodes(
    client: SlurmClient, job_id: int, nodes: list[str], command: str, name: str, timeout: float, env: dict[str, str]
) -> Result:
    """Run `command` once per node of the job (one task each), waiting for all; its output is captured. No --nodes:
    newer Slurm refuses it beside --distribution=arbitrary, and the node list gives the count."""
    return client.runner.run(
        "srun",
        f"--jobid={job_id}",
        f"--ntasks={len(nodes)}",
        f"--nodelist={','.join(nodes)}",
        "--distribution=arbitrary",
        "--export=ALL",
        f"--job-name={name}",
        command,
        timeout=timeout,
        check=False,
        retry=False,
        env=env,
    )
