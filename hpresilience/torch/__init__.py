"""Training-side library: tiered torch.distributed.checkpoint storage and the preemption notice.

Needs the optional extra `hpresilience[torch]`; nothing else in the package imports torch.

    cfg = CheckpointConfig(namespace=f"job-{job_id}", s3_base="s3://b/ckpt", s3_every=100)
    ckpt = TieredCheckpointer(cfg)
    step = ckpt.load(state) or 0
    ...
    ckpt.async_save(state, step)          # copies small tensors; the rest runs in the background
    if not check_alive(): ckpt.save(state, step); ckpt.close()
    heartbeat.beat(step)                  # progress for srun --auto-resume=1 (hangs, stragglers)
"""

from hpresilience.torch import heartbeat
from hpresilience.torch.checkpointer import TieredCheckpointer
from hpresilience.torch.layout import ChecksumError, MemoryTier
from hpresilience.torch.preemption import PreemptionWatcher, check_alive, install
from hpresilience.torch.private import TierSecurityError
from hpresilience.torch.reader import TierStorageReader
from hpresilience.torch.settings import CheckpointConfig, PreemptionConfig
from hpresilience.torch.staging import TornStateError
from hpresilience.torch.storage import TierStorageWriter

__all__ = [
    "CheckpointConfig",
    "ChecksumError",
    "MemoryTier",
    "PreemptionConfig",
    "PreemptionWatcher",
    "TierSecurityError",
    "TierStorageReader",
    "TierStorageWriter",
    "TieredCheckpointer",
    "TornStateError",
    "check_alive",
    "heartbeat",
    "install",
]
