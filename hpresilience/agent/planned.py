"""The agent on a cloud notice: a planned drain of its node, and the node notice file the ranks watch.

Functions of the Agent (agent/daemon.py) kept apart from its check cycle. The rules (docs/agent.md):
- the earliest due notice drains the node once, with `[hpr-agent] Planned:<kind> by <deadline> <detail>`
  (reasons.planned_reason), over no reason or an older Planned reason of ours; any other reason (a person's,
  the agent's own fault mark) is left as it is;
- the notice file is (re)written every cycle a notice is due, so a restart or a cleared /run brings it back;
- when every source that is on answered and none announces anything, the file goes and our own Planned
  drain is lifted; a source that did not answer is no news.
What was acted on (`agent.planned`) is kept in the agent's state file: Slurm is read only on a change.
"""

from __future__ import annotations

import time
from typing import Protocol

from prometheus_client import Counter

from hpresilience.agent import notices as cloud
from hpresilience.agent.settings import AgentSettings
from hpresilience.log import get_logger
from hpresilience.reasons import parse_planned, parse_reason
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node

log = get_logger("hpresilience.agent")


class _PlannedMetrics(Protocol):
    @property
    def planned(self) -> Counter: ...


class Agent(Protocol):
    """What of the agent (agent/daemon.py's Agent) a notice needs: named here, so that this module does not
    import the daemon that imports it."""

    planned: str | None
    next_notice_poll: float

    @property
    def settings(self) -> AgentSettings: ...
    @property
    def client(self) -> SlurmClient: ...
    @property
    def node_name(self) -> str: ...
    @property
    def metrics(self) -> _PlannedMetrics: ...
    @property
    def notices(self) -> cloud.NoticeWatcher | None: ...
    @property
    def observing(self) -> bool: ...
    def own_node(self) -> Node: ...


def notice_news(agent: Agent) -> bool:
    """Between cycles, every notices.poll_interval_s: whether the cloud's notices differ from what the agent
    last acted on (a cycle then runs at once). Costs the metadata requests only, never a Slurm call."""
    if agent.notices is None or time.monotonic() < agent.next_notice_poll:
        return False
    agent.next_notice_poll = time.monotonic() + agent.settings.notices.poll_interval_s
    poll = agent.notices.poll(time.time(), time.monotonic())
    n = poll.first
    withdrawn = n is None and poll.complete and agent.planned is not None
    news = (n is not None and n.reason != agent.planned) or withdrawn
    if news:
        log.info("notice_changed", node=agent.node_name, reason=n.reason if n else None)
    return news


def act_on_notice(agent: Agent, poll: cloud.Poll, me: Node | None, now: float) -> None:
    """A cloud notice: drain the node with a Planned reason (once) and write the node notice file. When every
    source answered and none announces anything any more (a maintenance canceled or completed), take the
    drain back (only our own Planned reason) and remove the file. Slurm is read only when this changes."""
    n = poll.first
    path = agent.settings.notices.notice_file
    if n is None:
        if not poll.complete:
            return  # a source did not answer: no news is not "withdrawn"
        if path and cloud.remove_notice_file(path):
            log.info("node_notice_removed", node=agent.node_name, path=path)
        if agent.planned is None:
            return
        if not agent.observing:
            me = me if me is not None else agent.own_node()
            was = parse_planned(me.reason)
            if was is not None and me.is_unavailable:
                agent.client.set_node_state([agent.node_name], "resume")
                log.warning(
                    "node_resumed",
                    node=agent.node_name,
                    why="the cloud notice was withdrawn",
                    previous_reason=me.reason,
                )
                agent.metrics.planned.labels(was.kind.value, "withdrawn").inc()
        agent.planned = None
        return
    reason = n.reason
    if agent.observing:
        if agent.planned != reason:
            log.warning("node_would_drain_planned", node=agent.node_name, reason=reason, source=n.source)
            agent.metrics.planned.labels(n.kind.value, "would_drain").inc()
            agent.planned = reason
        return
    if path:
        try:
            if cloud.write_notice_file(path, cloud.notice_document(n, agent.node_name, now)):
                log.warning("node_notice_written", node=agent.node_name, path=path, reason=reason)
        except OSError as err:  # the drain below still tells the wrapper
            log.error("node_notice_not_written", node=agent.node_name, path=path, error=str(err)[:200])
    if agent.planned == reason:
        return
    me = me if me is not None else agent.own_node()
    current = parse_reason(me.reason) if me.reason else None
    if current is None or (parse_planned(me.reason) is not None and me.reason != reason):
        agent.client.set_node_state([agent.node_name], "drain", reason)
        agent.metrics.planned.labels(n.kind.value, "drained").inc()
        log.warning(
            "node_drained_planned",
            node=agent.node_name,
            reason=reason,
            source=n.source,
            key=n.key,
            previous_reason=me.reason or None,
        )
    elif me.reason != reason:
        # A person's reason, or the agent's own fault mark: the node is out already; left as it is.
        agent.metrics.planned.labels(n.kind.value, "left").inc()
        log.warning(
            "planned_drain_left",
            node=agent.node_name,
            reason=reason,
            current_reason=me.reason,
            why="the node already carries a reason the notice must not overwrite",
        )
    agent.planned = reason
