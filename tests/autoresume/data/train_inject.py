#!/usr/bin/env python3
"""The recipe's train.py with faults injected from the environment (tests only; the recipe stays clean).

INJECT_SLOW_RANK / INJECT_SLOW_FACTOR: that rank's own work per step takes FACTOR times as long.
INJECT_ABORT_RANK / INJECT_ABORT_STEP: in the first attempt, that rank prints NCCL's watchdog message at
that step and aborts (SIGABRT), as ProcessGroupNCCL's watchdog does after a collective timeout.
INJECT_CPU_WORK=1: every rank's work is compute, not a sleep: it burns that many seconds of its own CPU time, so
a CPU quota on its node (`devcluster slow NODE --cpu F`) makes it take longer, as on a slow host.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

spec = importlib.util.spec_from_file_location("train", Path(__file__).with_name("train.py"))
assert spec and spec.loader
train: Any = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
RANK = int(os.environ.get("RANK", "0"))


class InjectedTime:
    """Stands in for `time` in train.py: its sleep is the rank's per-step work."""

    def __init__(self) -> None:
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.calls += 1
        env = os.environ
        if (
            env.get("INJECT_ABORT_RANK") == str(RANK)
            and env.get("AUTORESUME_ATTEMPT") == "1"
            and self.calls == int(env.get("INJECT_ABORT_STEP", "0"))
        ):
            print(
                f"[rank{RANK}]:[E ProcessGroupNCCL.cpp:616] [Rank {RANK}] Watchdog caught collective operation "
                "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=9, NumelOut=9, Timeout(ms)=600000) ran "
                "for 600083 milliseconds before timing out.",
                file=sys.stderr,
                flush=True,
            )
            os.abort()
        if env.get("INJECT_SLOW_RANK") == str(RANK):
            seconds *= float(env.get("INJECT_SLOW_FACTOR", "1.3"))
        if env.get("INJECT_CPU_WORK") == "1":
            end = time.process_time() + seconds
            while time.process_time() < end:
                pass
            return
        time.sleep(seconds)


train.time = InjectedTime()
sys.exit(train.main())
