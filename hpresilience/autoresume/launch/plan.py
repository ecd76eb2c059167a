"""Which nodes an attempt runs on, and the environment and srun command line that tell the step.

Rank order is stable across attempts: a survivor keeps its slot, a replacement takes the slot of the
node it replaces. Slurm itself would sort `--nodelist` by node index, so the step is launched with
`--distribution=arbitrary`, which lays tasks out in the order given: SLURM_PROCID follows NODE_LIST.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hpresilience.slurm.hostlist import compress

# Variables srun would take as defaults for the step's shape; the wrapper passes the shape explicitly and
# these, inherited from the batch script, describe the allocation as it was at submission.
STALE_SHAPE_VARS = (
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_DISTRIBUTION",
    "SLURM_HOSTFILE",
    "SLURM_NODELIST_STEP",
)


# What the wrapper gives the ranks beside environment()'s variables (StepRunner.run_attempt, flight_recorder_env):
# the heartbeat period, the evidence directory, the notice file check_alive() watches, and PyTorch's flight
# recorder. A user's `--export=NONE` or explicit list must still carry them (issue 32: without HPR_NOTICE_FILE,
# check_alive() never saw a move notice); each is exported when the step's environment has it.
RANK_VARIABLES = (
    "HPR_HEARTBEAT_EVERY_S",
    "HPR_EVIDENCE_DIR",
    "HPR_NOTICE_FILE",
    "HPR_RESTORE_MAX_STEP",
    "HPR_SKIP_STEPS",
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    # The in-process mode's (hpresilience/torch/world.py): the world file, the node's first rank, its generation.
    "HPR_WORLD_FILE",
    "HPR_RANK_BASE",
    "HPR_GENERATION",
    "HPR_STANDBY_NODE",
)
# What Launch.environment() sets: the step's shape, the attempt, the job.
SHAPE_VARIABLES = (
    "NODE_LIST",
    "NNODES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "NTASKS_PER_NODE",
    "AUTORESUME_ATTEMPT",
    "AUTORESUME_RESTARTS",
    "HPR_AUTORESUME_JOB",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
    "HPR_NODES_REQUESTED",
    "HPR_NODES_NOW",
)


def carried_names(env: Mapping[str, str] | None = None) -> list[str]:
    """The variables a user's own `--export` list must still carry into a step: the shape's, and those of
    RANK_VARIABLES that `env` (the step's environment) holds."""
    return [*SHAPE_VARIABLES, *(name for name in RANK_VARIABLES if env is not None and name in env)]


def export_option(user_export: str | None, carried: Sequence[str]) -> str:
    """srun's `--export=` value for a step: ALL, or a user's ALL[,...], as given; a user's explicit list (or NONE)
    with `carried` added, or the step would start without the variables it is placed by."""
    if user_export is None or user_export.upper().startswith("ALL"):
        return user_export or "ALL"
    head = "" if user_export.upper() == "NONE" else user_export + ","
    return head + ",".join(carried)


def plan_nodes(
    allocation: Sequence[str], size: int, bad: Iterable[str] = (), previous: Sequence[str] | None = None
) -> list[str] | None:
    """The step's nodes in rank order, or None when the healthy part of the allocation is too small.

    First attempt: the first `size` healthy nodes in allocation order (the rest are hot spares).
    Later: the previous list with each lost node's slot given to the next free healthy node."""
    bad_set = set(bad)
    healthy = [n for n in allocation if n not in bad_set]
    if len(healthy) < size:
        return None
    if not previous:
        return healthy[:size]
    keep = set(healthy)
    used = {n for n in previous if n in keep}
    free = iter(n for n in healthy if n not in used)
    plan: list[str] = []
    for n in previous[:size]:
        plan.append(n if n in keep else next(free))
    while len(plan) < size:
        plan.append(next(free))
    return plan


def master_port(base: int, span: int, job_id: int, attempt: int) -> int:
    """A new port on every attempt (no TIME_WAIT or stale store), and apart from other jobs' ports.

    The job's start is a hash of its id, not a multiple of it: clusters number jobs from `FirstJobId`, often a
    round number, and `job_id * k % span` put the first jobs of such clusters on one port."""
    return base + (zlib.crc32(str(job_id).encode()) + attempt) % span


@dataclass(frozen=True)
class AttemptLaunch:
    attempt: int
    nodes: tuple[str, ...]
    allocation: tuple[str, ...]
    master_addr: str
    master_port: int
    tasks_per_node: int
    job_marker: str = ""  # the job id
    requested: int = 0  # the step's full size; more than len(nodes) while running short (min_nodes)

    def environment(self, base: Mapping[str, str], restarts: int) -> dict[str, str]:
        env = {k: v for k, v in base.items() if k not in STALE_SHAPE_VARS}
        alloc = compress(self.allocation)
        n = len(self.nodes)
        env.update(
            {
                "NODE_LIST": ",".join(self.nodes),
                "NNODES": str(n),
                "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port),
                "WORLD_SIZE": str(n * self.tasks_per_node),
                "NTASKS_PER_NODE": str(self.tasks_per_node),
                "AUTORESUME_ATTEMPT": str(self.attempt),
                "AUTORESUME_RESTARTS": str(restarts),
                # Marks every task of this job's steps, also those that leave the step (see StepRunner.reap).
                "HPR_AUTORESUME_JOB": self.job_marker,
                "SLURM_JOB_NODELIST": alloc,
                "SLURM_NODELIST": alloc,
                "SLURM_NNODES": str(len(self.allocation)),
                "SLURM_JOB_NUM_NODES": str(len(self.allocation)),
                "HPR_NODES_REQUESTED": str(max(self.requested, n)),
                "HPR_NODES_NOW": str(n),
            }
        )
        if n < self.requested:
            # Running short: the failed nodes stay in the job, out of the step; the step's shape is what it runs on.
            env.update(
                {
                    "SLURM_JOB_NODELIST": compress(self.nodes),
                    "SLURM_NODELIST": compress(self.nodes),
                    "SLURM_NNODES": str(n),
                    "SLURM_JOB_NUM_NODES": str(n),
                }
            )
        return env

    def srun_argv(
        self,
        srun: str,
        job_id: int,
        step_name: str,
        passthrough: Sequence[str],
        command: Sequence[str],
        user_export: str | None = None,
        overlap: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """The step's srun command line; `env` is the environment it runs with (what a user's own `--export`
        list must still carry of it: carried_names)."""
        n = len(self.nodes)
        # With arbitrary distribution the node list is a task list: each node once per task on it. The node count
        # follows from it; Slurm 23.02+ refuses --nodes beside it ("--nodes is incompatible with
        # --distribution=arbitrary"), 22.05 accepts either.
        tasks = [node for node in self.nodes for _ in range(self.tasks_per_node)]
        export = export_option(user_export, carried_names(env))
        argv = [
            srun,
            f"--jobid={job_id}",
            f"--ntasks={n * self.tasks_per_node}",
            f"--nodelist={','.join(tasks)}",
            "--distribution=arbitrary",
            "--kill-on-bad-exit=1",
            f"--export={export}",
        ] + (["--overlap"] if overlap else [])
        # Last, so that it wins over a user's -J: the wrapper finds its step by this name to signal it.
        return [*argv, *passthrough, f"--job-name={step_name}", *command]
