"""Hangs without user rules: when silence is a hang, and which ranks and nodes held everyone up.

`HangClock` reads the progress stream (progress.py): once the step showed progress, silence reaching
max(hang_floor_s, hang_interval_factor x the median interval between a rank's or task's progress events)
is a hang (measured from when the last progress line was read; declared at that instant); between the
first event and the second, the allowance is hang_first_step_s. Before any
progress nothing is declared (a start cut-off is a log rule's job, expectedStartCutOffInSeconds). Silence
is a hang only while the step still has tasks: the supervisor counts them first (slurm/nodeprocs.py,
step_task_counts), and a step whose tasks have all ended (srun waits on a process that escaped the step and
holds its output) is ended instead, `dismiss` starting the clock again.

`attribute` is pure: from the processes the probe saw on each node (state, RANK, else the rank whose heartbeat
came from that pid), the stacks each rank
wrote on request, and the ranks the stream knows, it names the suspects. Strong evidence of a culprit:
a node that did not answer the probe; a rank stopped (T), in uninterruptible sleep (D) or a zombie (Z);
a rank that announced a stack signal and wrote no stack (it runs no Python, or is stopped); a rank the
stream knew whose process is gone. The verdict is unambiguous when every suspect is on one node and
every other node answered; otherwise the step relaunches on the same nodes and the events say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpresilience.autoresume.progress import ProgressStream, RankInfo
from hpresilience.slurm.nodescripts import ProcState

BAD_STATES = {
    "T": "stopped (SIGSTOP or a debugger)",
    "t": "stopped by a tracer",
    "D": "in uninterruptible sleep (a driver or file system call that does not return)",
    "Z": "a zombie (exited, not reaped)",
}


@dataclass(frozen=True)
class HangDue:
    silent_s: float
    threshold_s: float
    last_progress: float
    median_interval_s: float | None
    # The step's tasks were found gone once already at this silence (escaped processes reaped), and srun still
    # runs a whole threshold later: no second look, it is declared.
    rechecked: bool = False


class HangClock:
    def __init__(self, stream: ProgressStream, floor_s: float, factor: float, first_step_s: float) -> None:
        self.stream = stream
        self.floor_s = floor_s
        self.factor = factor
        self.first_step_s = first_step_s
        self.dismissed_at: float | None = None
        self.dismissed_for: float | None = None  # the last progress when the tasks were found gone

    def reset(self) -> None:
        self.dismissed_at = self.dismissed_for = None

    def dismiss(self, now: float) -> None:
        """The step's tasks had all ended at `now` (srun lingered on an escaped process's open output): the
        silence is not a hang; the clock starts again from `now`."""
        self.dismissed_at, self.dismissed_for = now, self.stream.last_progress()

    def rechecking(self) -> bool:
        """The tasks were found gone at this silence already: the next deadline is declared without a look."""
        return self.dismissed_at is not None and self.dismissed_for == self.stream.last_progress()

    def deadline(self) -> float | None:
        """When the current silence becomes a hang (monotonic), None before any progress. The supervisor's
        loop wakes at this instant, so a hang is declared at the threshold, not a poll tick after it."""
        last = self.stream.last_progress()
        limit = self.threshold()
        if last is None or limit is None:
            return None
        if self.dismissed_at is not None and self.dismissed_for == last:
            return self.dismissed_at + limit
        return last + limit

    def threshold(self) -> float | None:
        if self.stream.last_progress() is None:
            return None
        median = self.stream.median_interval()
        if median is None:
            return max(self.floor_s, self.first_step_s)
        return max(self.floor_s, self.factor * median)

    def check(self, now: float) -> HangDue | None:
        last = self.stream.last_progress()
        limit = self.threshold()
        deadline = self.deadline()
        if last is None or limit is None or deadline is None or now < deadline:
            return None
        return HangDue(
            now - last,
            limit,
            last,
            self.stream.median_interval(),
            rechecked=self.dismissed_at is not None and self.dismissed_for == last,
        )


@dataclass(frozen=True)
class Suspect:
    node: str
    rank: int | None
    pid: int | None
    why: str
    exited: bool = False  # a rank the stream knew whose process is gone (a crash, or the training's end)


@dataclass
class Attribution:
    suspects: list[Suspect] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        seen: list[str] = []
        for s in self.suspects:
            if s.node not in seen:
                seen.append(s.node)
        return seen

    @property
    def unambiguous(self) -> bool:
        """One node holds every suspect, and every other node of the step answered."""
        nodes = self.nodes
        return len(nodes) == 1 and all(n == nodes[0] for n in self.unanswered)

    @property
    def ranks(self) -> list[int]:
        return sorted({s.rank for s in self.suspects if s.rank is not None})


def attribute(
    step_nodes: Sequence[str],
    reports: Mapping[str, Sequence[ProcState] | None],
    stacks: Mapping[int, bool],
    ranks: Mapping[int, RankInfo],
) -> Attribution:
    """`reports[node]`: the processes the probe saw there (None: the node did not answer). `stacks[pid]`:
    whether the pid wrote a stack after being asked (only pids that were asked). `ranks`: the stream's."""
    out = Attribution()
    seen_ranks: set[int] = set()
    # Tasks started by srun itself (no torchrun) have no RANK in their environment: the heartbeat's pid, which
    # is the pid the probe sees on that node (same PID namespace), names their rank.
    by_pid = {(info.node, info.pid): rank for rank, info in ranks.items() if info.pid}
    for node in step_nodes:
        procs = reports.get(node)
        if procs is None:
            out.unanswered.append(node)
            out.suspects.append(Suspect(node, None, None, "the node ran no probe task within the bound"))
            continue
        out.answered.append(node)
        for p in procs:
            rank = p.rank if p.rank is not None else by_pid.get((node, p.pid))
            if rank is None:
                # A process of the job stopped or stuck in the kernel is evidence even when its rank is unknown
                # (no heartbeats); a zombie without a rank is more likely a helper not yet reaped.
                if p.state in BAD_STATES and p.state != "Z":
                    why = f"a process of the job (pid {p.pid}, no rank known) is {BAD_STATES[p.state]}, wchan {p.wchan}"
                    out.suspects.append(Suspect(node, None, p.pid, why))
                continue
            seen_ranks.add(rank)
            if p.state in BAD_STATES:
                out.suspects.append(
                    Suspect(node, rank, p.pid, f"rank {rank} (pid {p.pid}) is {BAD_STATES[p.state]}, wchan {p.wchan}")
                )
            elif stacks.get(p.pid) is False:
                out.suspects.append(
                    Suspect(
                        node,
                        rank,
                        p.pid,
                        f"rank {rank} (pid {p.pid}) wrote no Python stack when asked (state {p.state})",
                    )
                )
    for rank, info in sorted(ranks.items()):
        if rank not in seen_ranks and info.node in out.answered:
            out.suspects.append(
                Suspect(
                    info.node,
                    rank,
                    info.pid or None,
                    f"rank {rank} sent heartbeats from {info.node} and its process is gone",
                    exited=True,
                )
            )
    return out
