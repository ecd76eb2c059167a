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
    within `silent_s`. Everyone silent is a pause or a hang (hang detection's case), not one lost node."""
    last: dict[str, float] = {}
    for info in tasks:
        if info.node in nodes:
            last[info.node] = max(last.get(info.node, info.last_at), info.last_at)
    if len(last) < 2 or now - max(last.values()) >= silent_s:
        return []
    return [n for n in nodes if n in last and now - last[n] >= silent_s]


class SilenceWatch:
    """Which silent nodes to probe now: each at most once per silence (a node that answered is left alone until
    it prints again)."""

    def __init__(self, silent_s: float) -> None:
        self.silent_s = silent_s
        self._answered: dict[str, float] = {}  # node -> its last output time when it answered a probe

    def reset(self) -> None:
        self._answered.clear()

    def suspects(self, tasks: Sequence[RankInfo], nodes: Sequence[str], now: float) -> list[str]:
        if self.silent_s <= 0:
            return []
        last = {i.node: i.last_at for i in tasks}
        for info in tasks:
            last[info.node] = max(last[info.node], info.last_at)
        return [n for n in silent_nodes(tasks, nodes, now, self.silent_s)
                if self._answered.get(n) != last.get(n)]

    def answered(self, nodes: Iterable[str], tasks: Sequence[RankInfo]) -> None:
        for n in nodes:
            self._answered[n] = max((i.last_at for i in tasks if i.node == n), default=0.0)
