"""Training-side library: tiered torch.distributed.checkpoint storage and the preemption notice.

Needs the optional extra `hpresilience[torch]`; nothing else in the package imports torch. The names
below are imported on first use, so the torch-free parts (`hpresilience.torch.cleanup`, used by the
Slurm epilog on nodes without torch) import without it.

    cfg = CheckpointConfig(namespace=f"job-{job_id}", s3_base="s3://b/ckpt", s3_every=100)
    ckpt = TieredCheckpointer(cfg)
    step = ckpt.load(state) or 0
    ...
    ckpt.async_save(state, step)          # the state is copied before it returns; writing runs behind
    if not check_alive(): ckpt.save(state, step); ckpt.close(keep_tier=True)
    heartbeat.beat(step)                  # progress for srun --auto-resume=1 (hangs, stragglers); saves beat too
    ckpt.close()                          # a clean end: also removes this job's memory tier
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpresilience.torch import heartbeat
    from hpresilience.torch.checkpointer import TieredCheckpointer
    from hpresilience.torch.integrity import ReplicaCheck, should_skip, skip_steps
    from hpresilience.torch.layout import ChecksumError, MemoryTier
    from hpresilience.torch.preemption import PreemptionWatcher, check_alive, install
    from hpresilience.torch.private import TierSecurityError
    from hpresilience.torch.reader import TierStorageReader
    from hpresilience.torch.settings import CheckpointConfig, PreemptionConfig, ReplicaCheckConfig
    from hpresilience.torch.staging import TornStateError
    from hpresilience.torch.storage import TierStorageWriter

_WHERE = {
    "TieredCheckpointer": "checkpointer",
    "ChecksumError": "layout",
    "MemoryTier": "layout",
    "PreemptionWatcher": "preemption",
    "check_alive": "preemption",
    "install": "preemption",
    "TierSecurityError": "private",
    "TierStorageReader": "reader",
    "CheckpointConfig": "settings",
    "PreemptionConfig": "settings",
    "ReplicaCheck": "integrity",
    "ReplicaCheckConfig": "settings",
    "should_skip": "integrity",
    "skip_steps": "integrity",
    "TornStateError": "staging",
    "TierStorageWriter": "storage",
}


def __getattr__(name: str) -> Any:
    if name == "heartbeat":  # a module of its own, torch-free: `from hpresilience.torch import heartbeat`
        return importlib.import_module("hpresilience.torch.heartbeat")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'hpresilience.torch' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hpresilience.torch.{module}"), name)


def __dir__() -> list[str]:
    # The names are lazy (__getattr__), so the default dir() lists none of them; tab completion
    # and help() read this. Submodules already imported are in globals() and stay listed.
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CheckpointConfig",
    "ChecksumError",
    "MemoryTier",
    "PreemptionConfig",
    "PreemptionWatcher",
    "ReplicaCheck",
    "ReplicaCheckConfig",
    "TierSecurityError",
    "TierStorageReader",
    "TierStorageWriter",
    "TieredCheckpointer",
    "TornStateError",
    "check_alive",
    "heartbeat",
    "install",
    "should_skip",
    "skip_steps",
]
