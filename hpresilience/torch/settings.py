"""Settings of the tiered checkpointer and of the preemption notice (pure pydantic: no torch here)."""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from hpresilience.reasons import NODE_NOTICE_FILE
from hpresilience.settings_base import Section

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _env_int(*names: str) -> int | None:
    for name in names:
        raw = os.environ.get(name, "")
        # SLURM_NTASKS_PER_NODE may read "2(x3)" on heterogeneous allocations; the leading count is ours.
        m = re.match(r"^\s*(\d+)", raw)
        if m:
            return int(m.group(1))
    return None


class CheckpointConfig(Section):
    """Where and how often checkpoints go: memory tier, peer copy, S3."""

    # Job identity: checkpoints of different jobs never mix. Include the Slurm job id (or the run name).
    namespace: str
    # Node-local memory tier (tmpfs). Each node holds its own ranks' shards and its peers' copies.
    # `{uid}` becomes the user's uid: the root must belong to the user and be closed to others (a shared
    # root would let one user plant files another unpickles), so each user gets their own.
    memory_dir: str = "/dev/shm/hpresilience-{uid}"
    # None: taken from torch.distributed once the process group exists.
    world_size: int | None = Field(default=None, ge=1)
    # Ranks that share one node (and one memory tier). None: LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, else 1.
    ranks_per_node: int | None = Field(default=None, ge=1)
    # Committed steps kept per tier in memory; older ones go only after a newer step committed.
    keep: int = Field(default=2, ge=1, le=100)
    # A restore behind the newest step committed anywhere the load can see (hpresilience/torch/staleness.py) is
    # always reported; with this, it is refused (an error) rather than silently redoing the steps in between.
    refuse_restore_behind: bool = False
    # Copy each rank's shard to the memory tier of a rank `ranks_per_node` further on (another node).
    replicate: bool = True
    # Expected bytes of one rank's shard; when set, the memory tier size is checked at start.
    shard_gib: float | None = Field(default=None, gt=0)
    # The durable tier, at most one of the two. s3://bucket/prefix for S3 (needs boto3: the `s3` extra).
    s3_base: str | None = None
    # An absolute folder on a shared filesystem (Lustre, GPFS, NFS, FSx) for the filesystem tier;
    # `{uid}` becomes the user's uid. Same layout and commit rule as S3.
    fs_base: str | None = None
    # Steps that are a multiple of this go to the durable tier (S3 or filesystem) after they commit in
    # memory (0: none). The name predates the filesystem tier; it applies to either.
    s3_every: int = Field(default=0, ge=0)
    # Committed steps kept in the durable tier (0: all).
    s3_keep: int = Field(default=0, ge=0)
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_max_concurrency: int = Field(default=4, ge=1, le=64)
    s3_part_size_mib: int = Field(default=64, ge=5, le=5120)
    # False (the default): async_save copies the whole state before it returns, so the checkpoint is the
    # state at the call whatever is written afterwards. True: large tensors are copied in a background
    # thread until the next module forward or optimizer.step(), which wait for it; writing saved tensors
    # by any other path before then is not allowed (caught where possible: TornStateError fails that save).
    background_staging: bool = False
    # With background staging, tensors smaller than this are still copied inside async_save (BatchNorm
    # statistics and counters that forward updates in place).
    inline_staging_below_mib: float = Field(default=1.0, ge=0)
    # Timeout of the checkpoint's own gloo groups (saves, replication, uploads, load agreement).
    timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _hyperpod_names(cls, data: Any) -> Any:
        """Accept SageMaker HyperPod's names: s3_tier_base_path = s3_base; save_to_s3=True = every
        committed step goes to S3 (s3_every=1) unless s3_every says otherwise."""
        if not isinstance(data, dict) or not ({"s3_tier_base_path", "save_to_s3"} & data.keys()):
            return data
        data = dict(data)
        if "s3_tier_base_path" in data:
            alias = data.pop("s3_tier_base_path")
            if data.get("s3_base") not in (None, alias):
                raise ValueError("s3_base and s3_tier_base_path (its HyperPod name) disagree; give one")
            data["s3_base"] = alias
        if data.pop("save_to_s3", False) and not data.get("s3_every"):
            data["s3_every"] = 1
        return data

    @field_validator("namespace")
    @classmethod
    def _namespace_is_a_name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-128 characters of letters, digits, '.', '_' or '-' (it names a folder)")
        return v

    @field_validator("s3_base")
    @classmethod
    def _s3_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("s3://") or len(v) <= 5 or v[5] == "/":
            raise ValueError("must look like s3://bucket[/prefix]")
        return v.rstrip("/")

    @field_validator("fs_base")
    @classmethod
    def _fs_path(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("must be an absolute path (a folder on a filesystem every node mounts)")
        return v.rstrip("/") or "/" if v is not None else v

    @model_validator(mode="after")
    def _s3_cadence_needs_base(self) -> CheckpointConfig:
        if self.s3_base and self.fs_base:
            raise ValueError("s3_base and fs_base are both set; the durable tier is one of them")
        if self.s3_every and not (self.s3_base or self.fs_base):
            raise ValueError("s3_every is set but neither s3_base nor fs_base is")
        return self

    def local_ranks(self) -> int:
        if self.ranks_per_node is not None:
            return self.ranks_per_node
        return _env_int("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE") or 1

    def s3_bucket_prefix(self) -> tuple[str, str]:
        assert self.s3_base is not None
        rest = self.s3_base[len("s3://") :]
        bucket, _, prefix = rest.partition("/")
        return bucket, prefix.strip("/")


class PreemptionConfig(Section):
    """Which notices make check_alive() return False."""

    # Signals that mean "you are being preempted"; Slurm's `--signal=USR1@120` is the usual one.
    signals: tuple[str, ...] = ("SIGUSR1", "SIGTERM")
    # A file whose existence means the node is going away: the hpresilience agent writes it on a cloud reclaim
    # or maintenance notice (docs/checkpoints.md). Trusted only when root owns it and its directory, and
    # neither is writable by others (a user cannot forge it on a shared node). None: not watched.
    notice_file: str | None = NODE_NOTICE_FILE
    # Poll the EC2 spot interruption notice (instance metadata) in a background thread.
    ec2_spot: bool = False
    ec2_metadata_url: str = "http://169.254.169.254"
    ec2_poll_s: float = Field(default=5.0, gt=0)

    @field_validator("signals")
    @classmethod
    def _known_signals(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        import signal

        out = []
        for name in v:
            full = name if name.startswith("SIG") else f"SIG{name}"
            if not isinstance(getattr(signal, full, None), signal.Signals):
                raise ValueError(f"unknown signal {name!r}")
            out.append(full)
        return tuple(out)


class ReplicaCheckConfig(Section):
    """The replica check of torch/integrity.py: how often, and which ranks are replicas of each other."""

    # Compare the replicas' state every this many steps (a hash per rank, gathered: docs/integrity.md has the cost).
    every: int = Field(default=100, ge=1)
    # Ranks that hold the same parameters, one list per replica group (HSDP: the ranks of one shard across the
    # replicas). None: every rank is a replica of every other (plain data parallel, DDP).
    groups: list[list[int]] | None = None
    # Include the optimizer's state (momentum, Adam moments): a flip there corrupts the next updates too.
    optimizer_state: bool = True

    @field_validator("groups")
    @classmethod
    def _disjoint(cls, v: list[list[int]] | None) -> list[list[int]] | None:
        if v is None:
            return v
        flat = [r for g in v for r in g]
        if len(flat) != len(set(flat)) or any(r < 0 for r in flat):
            raise ValueError("replica groups must be disjoint lists of ranks >= 0")
        return v
