"""Export one committed step of the memory tier (or an S3 download of it) to a plain torch.save file.

torch's own `format_utils.dcp_to_torch_save` reads only FileSystemWriter's layout; this is the same
conversion through our reader. Run it in one process (it loads the whole state into memory).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from hpresilience.torch.reader import TierStorageReader


def load_full_state(step_dir: str | os.PathLike[str], shard_dirs: list[Path] | None = None) -> dict[str, Any]:
    """The whole state of a step as a nested dict of tensors and objects, as the trainer saved it.

    `shard_dirs` name further folders holding other ranks' shards (other nodes' tiers, an S3 download).
    """
    sd: dict[str, Any] = {}
    reader = TierStorageReader(Path(step_dir), shard_dirs=shard_dirs)
    planner = _EmptyStateDictLoadPlanner()  # type: ignore[no-untyped-call]
    _load_state_dict(sd, storage_reader=reader, planner=planner, no_dist=True)
    return sd


def export_torch_save(
    step_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], shard_dirs: list[Path] | None = None
) -> None:
    """Write the step as one `torch.save` file that `torch.load` reads without hpresilience."""
    torch.save(load_full_state(step_dir, shard_dirs), out_path)
