"""The node agent: runs checks on a schedule and on events, and acts on verdicts through Slurm.

One loop per node. Each cycle runs the passive checks (and the active ones when they are due and Slurm
shows this node idle or drained by us), turns the results into a Decision through `guard.decide`, and
applies it. What it asks slurmctld must not grow with the cluster, since every node runs one:
- a healthy cycle asks nothing;
- this node's own record (one `scontrol show node NAME`) is read only when it is needed: an active check
  is due (so a node going idle is seen at the active-check interval, not every cycle), a finding is to be
  judged, or a mark of the agent's own may be on the node and could be lifted;
- the fleet ceiling's view (the node's partitions grouped by reason, one `sinfo` query) is read only when a
  mark is about to be made, and once more after marking to settle a race with other agents.
In observe mode (agent.mode, or a check's own mode) a confirmed fault is logged and counted as
decision="would_mark" and nothing is done; an observing agent runs no Slurm command at all (and so no active
check, which needs the node out of scheduling). A cycle holds the agent's state lock from reading its state
to writing it back: the daemon and Slurm's HealthCheckProgram (`agent --once`) share that state.
What a decision writes (the mark, its lifting, the ceiling's roll-back) is agent/marking.py's.
A fault event (an XID in the kernel log, an NVML event) wakes the loop at once: that is the event path
whose latency bench/ measures. A cloud reclaim or maintenance notice drains the node as a planned move
(agent/planned.py). Nothing here raises out of the loop: a failed cycle is logged and retried.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry

from hpresilience.agent import hold, marking, planned
from hpresilience.agent import notices as cloud
from hpresilience.agent.guard import Decision, DecisionKind, FleetView, Memory, decide
from hpresilience.agent.marking import AgentMetrics
from hpresilience.agent.settings import AgentSettings
from hpresilience.agent.watchdog import WatchdogPinger
from hpresilience.fileio import atomic_write_text, locked, read_json_state
from hpresilience.health.base import CheckResult, Mode
from hpresilience.log import get_logger
from hpresilience.reasons import parse_planned, parse_reason
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.systemd import notify

log = get_logger("hpresilience.agent")


class Collector(Protocol):
    """The agent's view of the health checks (agent/collector.py): passive and active runs, and fault events."""

    def passive(self) -> Sequence[CheckResult]: ...

    def active(self) -> Sequence[CheckResult]: ...

    def wait_event(self, timeout: float) -> bool:
        """Block up to `timeout` s; True as soon as a fault event (XID, NVML event) arrived."""
        ...


@runtime_checkable
class Cancellable(Protocol):
    """A collector that can kill its checks in flight (agent/collector.py's can; a test's may not)."""

    def cancel(self) -> None: ...


@runtime_checkable
class ObservingSome(Protocol):
    """A collector whose profile names checks only observed while the agent enforces (`mode: observe`)."""

    @property
    def observe_only(self) -> frozenset[str]: ...


def fault_mark_of_ours(node: Node) -> bool:
    """The node's reason is this agent's fault mark: the agent's tag, and not a planned drain (a cloud notice's,
    which the notice decides, agent/planned.py)."""
    return parse_reason(node.reason).owner == "agent" and parse_planned(node.reason) is None


def default_node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        client: SlurmClient,
        collector: Collector,
        node_name: str = "",
        registry: CollectorRegistry | None = None,
        lock_wait_s: float | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.collector = collector
        self.node_name = node_name or settings.node_name or default_node_name()
        self.registry = registry or CollectorRegistry()
        self.metrics = AgentMetrics(self.registry)
        self.memory = Memory()
        # Wall-clock time of the last active-check run, kept in the state file: `agent --once` (Slurm's
        # HealthCheckProgram) is a new process every time and must not stress an idle node every interval.
        self.last_active = 0.0
        # When this node's state was last read for the active checks: they wait for idle at that pace.
        self.last_active_look = float("-inf")
        self.last_ok_cycle = 0.0
        self.stop_event = threading.Event()
        self.state_path = Path(settings.state_dir) / f"agent-{self.node_name}.json"
        # One lock for the state the daemon and `agent --once` (HealthCheckProgram) both read and write back.
        self.lock_path = Path(settings.state_dir) / "state.lock"
        self.lock_wait_s = settings.cycle_timeout_s if lock_wait_s is None else lock_wait_s
        self._state_stamp: tuple[int, int, int] | None = None
        # Checks whose faults are only observed while the agent enforces (health.checks.NAME.mode: observe).
        self.observe_only = (
            frozenset(collector.observe_only) if isinstance(collector, ObservingSome) else frozenset[str]()
        )
        # The node is (or may still be) drained by this agent for its active checks: kept in the state file, so
        # the run after one killed mid-check (HealthCheckTimeout) looks at the node and gives it back.
        self.holding = False
        # The planned-drain reason this agent last acted on (drained, or found a person's reason and left it):
        # a notice is acted on once, not re-read from Slurm every cycle; kept in the state file.
        self.planned: str | None = None
        self.notices = cloud.NoticeWatcher(settings.notices) if settings.notices.sources else None
        self.next_notice_poll = 0.0
        self._load_memory()

    @property
    def observing(self) -> bool:
        """Observe mode (or --dry-run): log and count what would be done, never write to Slurm."""
        return self.settings.dry_run or self.settings.mode is Mode.OBSERVE

    # -- persistence: repeat streaks survive an agent restart ------------------------------------------
    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.state_path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _load_memory(self) -> None:
        self._state_stamp = self._stamp()
        # No file, or one nobody can read (warned of): the memory stays as it is.
        data = read_json_state(self.state_path, "agent_state_unreadable")
        if data is None:
            return
        try:
            self.memory.streaks = {str(k): int(v) for k, v in data.get("streaks", {}).items()}
            marked = data.get("marked")
            self.memory.marked = marked if isinstance(marked, bool) else None
            self.last_active = float(data.get("last_active_at", 0.0))
            self.holding = data.get("holding") is True
            planned = data.get("planned")
            self.planned = planned if isinstance(planned, str) else None
        except (ValueError, AttributeError, TypeError) as err:
            # Start afresh (streaks at zero, own node read once), but say so: a state file nobody can read
            # is worth an operator's look.
            log.warning("agent_state_unreadable", path=str(self.state_path), error=str(err)[:200])

    def _save_memory(self) -> None:
        try:
            atomic_write_text(
                self.state_path,
                json.dumps(
                    {
                        "streaks": self.memory.streaks,
                        "marked": self.memory.marked,
                        "last_active_at": self.last_active,
                        "holding": self.holding,
                        "planned": self.planned,
                    }
                ),
            )
            self._state_stamp = self._stamp()
        except OSError as err:
            log.warning("agent_state_not_saved", path=str(self.state_path), error=str(err))

    # -- one cycle -------------------------------------------------------------------------------------
    def active_allowed(self, node: Node) -> bool:
        """Active checks stress the hardware: only on an idle node, or one out of service by our hand; and only
        when the agent may take the node out of scheduling for them (not while it observes)."""
        if not self.settings.active_checks or node.is_busy or self.observing:
            return False
        if node.is_idle:
            return True
        # Not on a node drained for a cloud notice: it is leaving, and a stress run there proves nothing.
        return fault_mark_of_ours(node)

    def active_due(self) -> bool:
        if not self.settings.active_checks:
            return False
        interval = self.settings.active_interval_s
        # A clock stepped back (last run "in the future") counts as due, never as never again.
        since = time.time() - self.last_active
        return not 0 <= since < interval and time.monotonic() - self.last_active_look >= interval

    def own_node(self) -> Node:
        """This node as Slurm sees it: one query naming it, whatever the cluster's size."""
        me = self.client.node(self.node_name)
        # A planned drain is not a mark to lift when checks pass: the notice decides (act_on_notice).
        self.memory.marked = me.is_unavailable and fault_mark_of_ours(me)
        return me

    def fleet_view(self, me: Node) -> FleetView:
        """The node's partitions grouped by reason: one query, sized by the distinct reasons there. A node in
        no partition is held to the ceiling of the whole cluster."""
        groups = self.client.reason_groups(me.partitions)
        if not me.partitions:
            groups = [replace(g, partition="") for g in groups]
        return FleetView(groups)

    def cycle(self, now: float | None = None) -> Decision:
        """One cycle under the state lock; another process's cycle in flight past `lock_wait_s`: skipped."""
        self.state_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with locked(self.lock_path, self.lock_wait_s) as got:
            if not got:
                log.warning(
                    "agent_cycle_skipped_busy", node=self.node_name, lock=str(self.lock_path), waited_s=self.lock_wait_s
                )
                return Decision(DecisionKind.NONE, "another agent cycle holds this node's state; skipped")
            if self._stamp() != self._state_stamp:
                self._load_memory()  # the other process (daemon or --once) wrote since we last did
            return self._cycle(now)

    def _cycle(self, now: float | None) -> Decision:
        results = list(self.collector.passive())
        t = time.time() if now is None else now
        notice = self.notices.poll(t, time.monotonic()) if self.notices is not None else None
        me: Node | None = None
        held: hold.Hold | None = None
        if not self.observing and self.active_due():
            me = self.own_node()
            self.last_active_look = time.monotonic()
            if self.active_allowed(me):
                held = hold.take(self.client, me)
            if held is not None:
                if held.taken:  # a run killed mid-check (HealthCheckTimeout) leaves the next run a reason to look
                    self.holding = True
                    self._save_memory()
                me = hold.as_before(me)
                try:
                    results += self.collector.active()
                except BaseException:
                    self._give_back()
                    raise
                self.last_active = time.time()
        for r in results:
            self.metrics.checks.labels(r.check, r.status.value).inc()
            self.metrics.duration.labels(r.check).observe(r.duration_s)
        self.memory.observe(results)
        observed = [r for r in results if self.observing or r.check in self.observe_only]
        would = marking.note_observed(self, observed)
        enforced = [] if self.observing else [r for r in results if r.check not in self.observe_only]
        # Nothing to report and no mark of ours to lift: nothing to ask Slurm.
        may_lift = self.settings.resume_when_clear and self.memory.marked is not False and not self.observing
        if me is None and (any(r.asks_action for r in enforced) or may_lift or self.holding):
            me = self.own_node()
        if me is None:
            decision = would or Decision(DecisionKind.NONE, "healthy")
            if would is None:
                self.metrics.decisions.labels(decision.kind.value, "none").inc()
        else:
            if held is None and hold.is_hold(me):  # left by a run that was stopped mid-check
                self._give_back()
                me = hold.as_before(me)
            seen = me
            decision = decide(me, lambda: self.fleet_view(seen), enforced, self.memory, self.settings, t)
            marking.apply(self, me, decision, results)
            if decision.kind is DecisionKind.MARK and parse_reason(me.reason).owner != "agent":
                decision = marking.verify_ceiling(self, me, decision)
        if held is not None and held.taken:
            self._give_back()
        elif self.holding and held is None and me is not None and not hold.is_hold(me):
            self.holding = False  # someone else took the node back meanwhile
        if notice is not None:
            self.act_on_notice(notice, me, t)
        self._save_memory()
        self.metrics.last_cycle.set(time.time())
        self.last_ok_cycle = time.monotonic()
        log.debug("check_cycle_finished", node=self.node_name, decision=decision.kind.value, checks=len(results))
        return decision

    def notice_news(self) -> bool:
        """Between cycles, every notices.poll_interval_s: whether the cloud's notices differ from what the agent
        last acted on (a cycle then runs at once). Costs the metadata requests only, never a Slurm call."""
        return planned.notice_news(self)

    def act_on_notice(self, poll: cloud.Poll, me: Node | None, now: float) -> None:
        """A cloud notice: the planned drain and the node notice file (agent/planned.py)."""
        planned.act_on_notice(self, poll, me, now)

    def _give_back(self) -> None:
        """End this agent's hold for the active checks (the node resumed unless a reason was set meanwhile)."""
        if hold.give_back(self.client, self.node_name):
            self.memory.marked = False
        self.holding = False

    # -- the loop --------------------------------------------------------------------------------------
    def healthy(self) -> bool:
        """/healthz: the last successful cycle is recent (three passive intervals)."""
        return time.monotonic() - self.last_ok_cycle < 3 * self.settings.passive_interval_s + 30

    def run(self) -> None:
        log.info(
            "agent_started",
            node=self.node_name,
            mode="observe" if self.observing else "enforce",
            observe_only=sorted(self.observe_only) or None,
            interval_s=self.settings.passive_interval_s,
        )
        notify("READY=1", f"STATUS=checking node {self.node_name}")
        watchdog = WatchdogPinger(self.settings.cycle_timeout_s).start()
        next_cycle = 0.0
        try:
            while not self.stop_event.is_set():
                now = time.monotonic()
                if now >= next_cycle:
                    watchdog.cycle_started()
                    try:
                        d = self.cycle()
                        notify(f"STATUS=last verdict: {d.kind.value} ({d.why})")
                    except Exception as err:  # noqa: BLE001 - never let one bad cycle end the daemon
                        self.metrics.cycle_errors.inc()
                        log.error("agent_cycle_failed", node=self.node_name, error=str(err), kind=type(err).__name__)
                    finally:
                        watchdog.cycle_ended()
                    next_cycle = time.monotonic() + self.settings.passive_interval_s
                    self.next_notice_poll = time.monotonic() + self.settings.notices.poll_interval_s
                elif self.notice_news():
                    next_cycle = 0.0  # a spot reclaim leaves two minutes: act now, not at the next cycle
                watchdog.beat()
                # Wait in short slices so that SIGTERM (stop_event) is honoured within a second.
                wait = min(max(0.0, next_cycle - time.monotonic()), 1.0)
                if self.collector.wait_event(wait):
                    log.info("fault_event_received", node=self.node_name)
                    next_cycle = 0.0
        finally:
            watchdog.stop()
        notify("STOPPING=1")
        log.info("agent_stopped", node=self.node_name)

    def stop(self) -> None:
        self.stop_event.set()
        # A cycle in flight may be 30 s into a stress test: the collector kills its checks when it can.
        if isinstance(self.collector, Cancellable):
            self.collector.cancel()
