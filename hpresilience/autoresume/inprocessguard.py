"""Whether an in-process recovery is still running, and when it must give way to the relaunch path (issue 33).

The in-process loop (inprocess.py) writes a new world and launches the replacement's step; the recovery is over
when the ranks say the new world formed: rank 0 writes the formed-world report once the first step in it
completed (hpresilience/torch/worldreport.py). Until then the recovery is running, and two things end it in a
fallback to the relaunch path from the last checkpoint:

- a second fault before the world formed (the replacement lost, a survivor lost during the join): the ranks of
  the half-built world cannot be trusted to agree, and a third world built on top of it would stack one
  recovery's failure on another's; the relaunch path starts all ranks over from a known state;
- the bound: no formed world within `inprocess_recovery_s` of its being written (a rank that will not tear
  down, a replacement that never joins, a join that hangs).

Each formed world is said in the events (`inprocess_world_formed`, with rank 0's times of each part), which is
what the ledger reads for the in-process recovery's parts (goodput/inprocessparts.py). The report is the job's
own user's file read by the job's own wrapper (as the world file is); a malformed one is said and ignored: the
bound then decides.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from hpresilience.autoresume.report import Reporter
from hpresilience.torch.world import WorldFileError
from hpresilience.torch.worldreport import TIMES, read_formed, report_path


class RecoveryGuard:
    def __init__(
        self, world_file: str, bound_s: float, reporter: Reporter, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.world_file = world_file
        self.bound_s = bound_s
        self.reporter = reporter
        self.clock = clock
        self.pending: int | None = None  # the generation being recovered into, until it formed
        self.since = 0.0
        self.reported = 0  # the newest generation said formed
        self._seen: tuple[int, int, int] | None = None

    def recovering(self, generation: int) -> None:
        """A recovery into `generation` began (its world is written)."""
        self.pending, self.since = generation, self.clock()

    def second_fault(self, nodes: list[str]) -> str | None:
        """Why a fault now must fall back (a recovery is still running), or None."""
        self.poll()
        if self.pending is None:
            return None
        return (
            f"a second fault (on {','.join(nodes)}) while the recovery into generation {self.pending} was still "
            f"running ({self.clock() - self.since:.1f} s in)"
        )

    def poll(self) -> str | None:
        """Say a newly formed world; why the running recovery must fall back (its bound passed), or None."""
        self._read()
        if self.pending is not None and self.clock() - self.since > self.bound_s:
            return f"generation {self.pending}'s world did not form within {self.bound_s:g} s (inprocess_recovery_s)"
        return None

    def _read(self) -> None:
        try:
            st = os.stat(report_path(self.world_file))
        except OSError:
            return
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            formed = read_formed(self.world_file)
        except (OSError, WorldFileError) as err:
            self.reporter.decision("inprocess_report_unreadable", error=str(err)[:300])
            return
        if formed is None or formed.generation <= self.reported:
            return
        self.reported = formed.generation
        if self.pending is not None and formed.generation >= self.pending:
            self.pending = None
        parts = formed.parts()
        self.reporter.decision(
            "inprocess_world_formed",
            generation=formed.generation,
            step=formed.step,
            rank0_cause=formed.cause,
            state_to=formed.state_to,
            grads_to=formed.grads_to,
            **{key: round(getattr(formed, key), 3) for key in TIMES},
            **{key: round(v, 3) for key, v in parts.items()},
        )
