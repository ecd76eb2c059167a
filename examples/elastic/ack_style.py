#!/usr/bin/env python3
"""A training script in the shape of Alibaba ACK's elastic-training example (`kubeai.check_alive()`), run
under `srun --auto-resume=1`: only the import differs. It trains while check_alive() is True, then saves and
exits; the wrapper relaunches it (on more or fewer nodes) and it resumes from what it saved.

Environment: CKPT_DIR (default ./ckpt), TRAIN_STEPS (100), TRAIN_STEP_SLEEP (0.1 s).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hpresilience.torch import check_alive  # ACK: from kubeai... import check_alive

CKPT = Path(os.environ.get("CKPT_DIR", "ckpt")) / "ack_state.json"
STEPS = int(os.environ.get("TRAIN_STEPS", "100"))


def load() -> int:
    return int(json.loads(CKPT.read_text())["step"]) if CKPT.exists() else 0


def train(step: int) -> int:
    time.sleep(float(os.environ.get("TRAIN_STEP_SLEEP", "0.1")))  # one step of real work
    return step + 1


def save_checkpoint(step: int) -> None:
    CKPT.parent.mkdir(parents=True, exist_ok=True)
    tmp = CKPT.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step}))
    tmp.replace(CKPT)
    print(f"saved step={step}", flush=True)


if __name__ == "__main__":
    step = load()
    while check_alive() and step < STEPS:
        step = train(step)
    save_checkpoint(step)
    sys.exit(0)
