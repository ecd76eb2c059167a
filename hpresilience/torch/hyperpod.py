"""Drop-in names for code written against SageMaker HyperPod's managed tiered checkpointing.

A training script written for HyperPod runs on hpresilience once its import lines change from

    from amzn_sagemaker_checkpointing.config.sagemaker_checkpoint_config import SageMakerCheckpointConfig
    from amzn_sagemaker_checkpointing.checkpointing.filesystem.filesystem import (
        SageMakerTieredStorageWriter, SageMakerTieredStorageReader)

to `from hpresilience.torch.hyperpod import (SageMakerCheckpointConfig, SageMakerTieredStorageWriter,
SageMakerTieredStorageReader)`. The writer carries the whole tiered behaviour (memory tier, peer copy on
another node, S3 when `save_to_s3` is set at the writer's creation, retention); the reader finds the
newest step itself (memory, then a peer copy, then S3, resharding when the world size changed) and
raises when there is none. Both run on one TieredCheckpointer per namespace and process, created by
the first writer or reader (on every rank, as HyperPod's examples do).

What HyperPod's service provides and we take from the environment instead: the memory tier's place
(`HPRESILIENCE_MEMORY_DIR`, default the per-user /dev/shm folder), ranks per node (`LOCAL_WORLD_SIZE`
or `SLURM_NTASKS_PER_NODE`) and the S3 endpoint (boto3's own `AWS_ENDPOINT_URL`, region settings).
"""

from __future__ import annotations

import atexit
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from hpresilience.errors import ConfigError
from hpresilience.torch import heartbeat
from hpresilience.torch.checkpointer import TieredCheckpointer
from hpresilience.torch.direct import DirectWriter
from hpresilience.torch.reader import TierStorageReader
from hpresilience.torch.settings import CheckpointConfig

_ENGINES: dict[tuple[str, str], TieredCheckpointer] = {}
_LOCK = threading.Lock()


@dataclass
class SageMakerCheckpointConfig:
    """HyperPod's configuration object, same fields and meaning (`logger` is accepted and unused)."""

    namespace: str
    world_size: int
    s3_tier_base_path: str | None = None
    save_to_s3: bool = False
    logger: Any = None

    def to_config(self) -> CheckpointConfig:
        if self.save_to_s3 and not self.s3_tier_base_path:
            raise ConfigError("save_to_s3 is set but s3_tier_base_path is not")
        kw: dict[str, Any] = {"namespace": self.namespace, "s3_base": self.s3_tier_base_path}
        if os.environ.get("HPRESILIENCE_MEMORY_DIR"):
            kw["memory_dir"] = os.environ["HPRESILIENCE_MEMORY_DIR"]
        return CheckpointConfig(**kw)


def checkpointer_for(config: SageMakerCheckpointConfig) -> TieredCheckpointer:
    """The process's TieredCheckpointer for this namespace (made on first use: collective)."""
    cfg = config.to_config()
    key = (cfg.namespace, cfg.memory_dir)
    with _LOCK:
        ck = _ENGINES.get(key)
        if ck is None:
            ck = TieredCheckpointer(cfg)
            if ck.world != config.world_size:
                raise ConfigError(
                    f"SageMakerCheckpointConfig.world_size is {config.world_size} but the process group "
                    f"has {ck.world} ranks"
                )
            _ENGINES[key] = ck
        return ck


@heartbeat.blocking("checkpoint")
def flush() -> None:
    """Wait until every save made through these classes is committed, copied and uploaded where due."""
    for ck in list(_ENGINES.values()):
        ck.flush()


@atexit.register
def _flush_at_exit() -> None:
    # Once the script destroyed its process groups, a pending copy could wait forever on them: skip.
    if not all(not ck.distributed or dist.is_initialized() for ck in _ENGINES.values()):
        return
    try:
        flush()
    except BaseException:  # noqa: BLE001 - nothing more can be done at exit
        pass


_STEP_IN_PATH = re.compile(r"step_(\d+)")


class SageMakerTieredStorageWriter(DirectWriter):
    """`SageMakerTieredStorageWriter(checkpoint_config=..., step=N)` or `(..., path=".../step_N/...")`."""

    def __init__(
        self, checkpoint_config: SageMakerCheckpointConfig, path: str | os.PathLike[str] = "", step: int = -1
    ) -> None:
        if step < 0:
            m = _STEP_IN_PATH.search(str(path))
            if m is None:
                raise ConfigError(f"invalid step value: give step=N or a path containing step_N (got {path!r})")
            step = int(m.group(1))
        ck = checkpointer_for(checkpoint_config)
        # Read at creation, as HyperPod does: set config.save_to_s3 before making the step's writer.
        to_s3 = bool(checkpoint_config.save_to_s3)
        if to_s3:
            ck._check_to_s3(True)
        super().__init__(ck.tier, step, world_size=ck.world, to_s3=to_s3, submit=ck.submit, fault_hook=ck.fault_hook)
        self.ck = ck

    @property
    def s3_checkpoint_dir(self) -> str:
        from hpresilience.torch.s3tier import S3Tier  # boto3 only where S3 is used

        tier = self.ck.durable
        assert isinstance(tier, S3Tier), "no S3 tier configured"
        return f"s3://{tier.bucket}/{tier.base}/step_{self.step:010d}"


class SageMakerTieredStorageReader(StorageReader):
    """Loads `step`, or the newest step every rank can get; raises FileNotFoundError when there is none."""

    def __init__(self, checkpoint_config: SageMakerCheckpointConfig, step: int | None = None) -> None:
        super().__init__()
        self.ck = checkpointer_for(checkpoint_config)
        self.step = step
        self.loaded_step: int | None = None
        self._inner: TierStorageReader | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._inner = None

    @heartbeat.blocking("restore")  # the goodput ledger's `restore`
    def read_metadata(self) -> Metadata:
        # Collective over the checkpointer's groups: DCP calls this on every rank at the same point.
        # dcp.load cannot be retried from inside, so damaged shards are found (and other sources tried)
        # before it reads anything.
        prepared = self.ck.prepare_load(self.step, verify_first=True)
        if prepared is None:
            raise FileNotFoundError(
                f"no checkpoint{'' if self.step is None else f' of step {self.step}'} of namespace "
                f"{self.ck.cfg.namespace!r} in memory, in peer copies or in S3"
            )
        self.loaded_step, self._inner = prepared
        return self._inner.read_metadata()

    def _reader(self) -> TierStorageReader:
        if self._inner is None:
            raise RuntimeError("read_metadata() must come first (dcp.load calls it)")
        return self._inner

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._reader().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return self._reader().prepare_local_plan(plan)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return self._reader().prepare_global_plan(plans)

    @heartbeat.blocking("restore")  # reading and the cleanup after it: one block
    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        try:
            return self._reader().read_data(plan, planner)
        finally:
            if self.loaded_step is not None:
                self.ck.finish_load(self.loaded_step)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False


__all__ = [
    "SageMakerCheckpointConfig",
    "SageMakerTieredStorageReader",
    "SageMakerTieredStorageWriter",
    "checkpointer_for",
    "flush",
]
