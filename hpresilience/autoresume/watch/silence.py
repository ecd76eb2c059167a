"""A node gone silent while the others go on: the sign of a partition or a hung NIC, long before Slurm sees it.

Slurm calls a node that stopped answering DOWN only after SlurmdTimeout (300 s by default), and pings it every
SlurmdTimeout/3; meanwhile the node's tasks are cut off, their output stops reaching srun, and nothing else
changes (measured on the devcluster's `--isolation netns`, docs/slurm-notes.md). The step's own output is free to
watch: a node whose every task printed progress before and none for `silent_node_s`, while another node's task
printed within that time, is a suspect. Only a suspect is probed (one trivial task through Slurm, a few seconds,
`slurm/steps.nodes_answering`), so a healthy run costs slurmctld nothing; a suspect that answers is not probed
again until it has printed once more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hpresilience.autoresume.progress import RankInfo


def silent_nodes(tasks: Iterable[RankInfo], nodes: Sequence[str], now: float, silent_s: float) -> list[str]:
    """The step's nodes whose tasks all printed before and none for `silent_s`, while another node's task printed
    within `silent_s`. Everyone silent is a pause, a hang or a partition under synchronous training: the stall
    watch's case (stallwatch.py), not one lost node."""
    last: dict[str, float] = {}
    for info in tasks:
        if info.node in nodes:
            last[info.node] = max(last.get(info.node, info.last_at), info.last_at)
    if len(last) < 2 or now - max(last.values()) >= silent_s:
        return []
    return [n for n in nodes if n in last and now - last[n] >= silent_s]


class SilenceWatch:
    """Which silent nodes to probe now: each at most once per silence, and a node that answered must stay silent
    twice as long as it was before it is probed again (block-buffered output arrives in bursts: a node whose
    bursts lag the others' settles after a probe or two instead of costing one per burst; capped at MAX_S)."""

    MAX_S = 300.0

    def __init__(self, silent_s: float) -> None:
        self.base_s = silent_s  # 0: off
        self.silent_s = silent_s  # the threshold of the last look (the base, or longer for a slow job)
        self._answered: dict[str, float] = {}  # node -> its last output time when it answered a probe
        self._threshold: dict[str, float] = {}  # node -> its own threshold once it answered a probe

    def reset(self) -> None:
        self._answered.clear()
        self._threshold.clear()

    def suspects(
        self, tasks: Sequence[RankInfo], nodes: Sequence[str], now: float, median_interval: float | None = None
    ) -> list[str]:
        """The nodes to probe now; a job whose progress lines come seldom (`median_interval`) is given three of
        its own intervals, so a slow step is never mistaken for a silent node."""
        if self.base_s <= 0:
            return []
        self.silent_s = max(self.base_s, 3 * (median_interval or 0.0))
        last: dict[str, float] = {}
        for info in tasks:
            last[info.node] = max(last.get(info.node, info.last_at), info.last_at)
        return [
            n
            for n in silent_nodes(tasks, nodes, now, self.silent_s)
            if self._answered.get(n) != last.get(n) and now - last[n] >= self._threshold.get(n, 0.0)
        ]

    def answered(self, nodes: Iterable[str], tasks: Sequence[RankInfo], now: float) -> None:
        for n in nodes:
            last = max((i.last_at for i in tasks if i.node == n), default=now)
            self._answered[n] = last
            self._threshold[n] = min(self.MAX_S, max(2 * self.silent_s, 2 * (now - last)))
