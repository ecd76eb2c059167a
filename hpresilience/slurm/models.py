"""Typed views of Slurm nodes and jobs, independent of the JSON shape they came from."""

from __future__ import annotations

from dataclasses import dataclass, field

# Base states are mutually exclusive; flags combine with them (Slurm's NODE_STATE_* and NODE_STATE_FLAGS).
NODE_BASE_STATES = frozenset({"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE"})
# States in which a node must not receive new work, whatever set them.
UNAVAILABLE_FLAGS = frozenset(
    {
        "DOWN",
        "DRAIN",
        "FAIL",
        "NOT_RESPONDING",
        "POWERED_DOWN",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "MAINTENANCE",
        "INVALID_REG",
        "FUTURE",
    }
)
# Flags of an idle node that Slurm has promised to other work (a planned start, a reservation, a job's
# block): in service, but not free for a job to grow into.
PROMISED_FLAGS = frozenset({"PLANNED", "RESERVED", "BLOCKED"})
# The states a job ends in. Slurm 22.05 and 23.02 give `job_state` as one word and put a flag there instead
# of the base state for held jobs (REQUEUE_HOLD, SPECIAL_EXIT, STOPPED, RESV_DEL_HOLD): anything not listed
# here is a job that is still alive in some form.
JOB_FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
    }
)


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    hostname: str
    # Upper-case Slurm words: one base state plus any flags, e.g. {"ALLOCATED", "FAIL"}.
    states: frozenset[str]
    reason: str = ""
    reason_set_by: str = ""
    reason_changed_at: int | None = None
    features: tuple[str, ...] = ()
    gres: str = ""
    partitions: tuple[str, ...] = ()
    cpus: int = 0
    slurmd_start_time: int | None = None
    boot_time: int | None = None

    def has(self, *states: str) -> bool:
        return any(s in self.states for s in states)

    @property
    def is_idle(self) -> bool:
        return (
            "IDLE" in self.states
            and not self.states & (UNAVAILABLE_FLAGS | PROMISED_FLAGS)
            and "COMPLETING" not in self.states
        )

    @property
    def is_busy(self) -> bool:
        return self.has("ALLOCATED", "MIXED", "COMPLETING")

    @property
    def is_failing(self) -> bool:
        """FAIL set while jobs still hold the node (sinfo `failg`)."""
        return "FAIL" in self.states and self.is_busy

    @property
    def is_drained(self) -> bool:
        """DRAIN set and nothing running any more (sinfo `drain`, not `drng`)."""
        return "DRAIN" in self.states and not self.is_busy

    @property
    def is_unavailable(self) -> bool:
        return bool(self.states & UNAVAILABLE_FLAGS)

    @property
    def state_text(self) -> str:
        """A short human form close to sinfo's: base state, then flags, lower case."""
        base = sorted(self.states & NODE_BASE_STATES)
        flags = sorted(self.states - NODE_BASE_STATES)
        return "+".join(s.lower() for s in base + flags) or "unknown"


@dataclass(frozen=True)
class ReasonGroup:
    """One line of `sinfo -h -o '%R|%D|%H|%N|%E'`: the nodes of one partition that share a state group and a
    reason. sinfo groups nodes by every field printed, so the lines grow with the distinct reasons, not with
    the partition; the counts of a partition's lines add up to its size."""

    partition: str
    count: int
    nodes: tuple[str, ...]
    reason: str = ""  # "" for nodes without a reason (sinfo prints "none")
    reason_at: int | None = None  # when the reason was set (epoch s); None without a reason


@dataclass(frozen=True)
class Job:
    job_id: int
    name: str
    state: str
    nodes: tuple[str, ...]
    num_nodes: int
    user: str
    partition: str = ""
    batch_host: str = ""
    restart_count: int = 0
    state_reason: str = ""
    dependency: str = ""
    excluded_nodes: tuple[str, ...] = ()
    flags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def is_pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def is_finished(self) -> bool:
        return self.state in JOB_FINAL_STATES
