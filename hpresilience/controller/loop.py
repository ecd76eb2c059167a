"""The controller loop: one read of the nodes in trouble per cycle, each repair moved at most one step per cycle.

Each poll asks slurmctld for the nodes out of service (`sinfo -R`: down, drained, failed, failing) and, by
name, those under repair (a repaired node is back in service): its cost grows with the nodes in trouble,
not with the cluster.

    pending --(jobs gone or forced DOWN, slot free)--> acting --(provider returned)--> waiting_back
    waiting_back --(slurmd registered again)--> gating --(gate passed)--> resumed (record finished)
    gating --(gate passed, but the node's lemon_repairs-th repair within lemon_window_s)--> lemon (drained,
        reason "hpr: needs a person ..." naming its repairs; a person resumes it)
    any failure (provider error, not back in time, gate failed) --> next rung of the ladder (pending),
    or past the last rung --> given_up (DOWN+DRAIN, a reason for a person)

Each step the loop drives is one function of steps.py (`STEP_FUNCTIONS`) that returns what to do; `apply` here is
the one place that writes the marks, moves and saves the record, logs the decision and starts the worker.
Provider calls and health gates run in worker threads so one slow re-image does not stall the others;
the record is written before each step is acted on. A controller restarted while a provider was acting
waits for the node instead of acting again: a repair is never issued twice at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from hpresilience.controller import steps
from hpresilience.controller.events import EventLog, Seen
from hpresilience.controller.gates import Gate, GateContext, create_gate
from hpresilience.controller.jobs import JobThread
from hpresilience.controller.metrics import ControllerMetrics
from hpresilience.controller.providers import Provider, ProviderContext, create_provider, provider_registry
from hpresilience.controller.selection import Look, first_rung, group_for, look
from hpresilience.controller.settings import ControllerSettings
from hpresilience.controller.state import ACTIVE_STEPS, STEPS, RepairRecord, StateStore
from hpresilience.controller.steps import STEP_FUNCTIONS, Finish, Gated, Move, Note, Returned, Start, Transition
from hpresilience.errors import HPResilienceError
from hpresilience.log import Level, get_logger, level_number
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.features import SlurmFeatures
from hpresilience.slurm.models import Node
from hpresilience.systemd import notify, watchdog_interval_s

log = get_logger("hpresilience.controller")
DEFAULT_GROUP = "default"


class Controller(JobThread):
    def __init__(
        self,
        settings: ControllerSettings,
        client: SlurmClient,
        registry: CollectorRegistry | None = None,
        gate: Gate | None = None,
    ) -> None:
        super().__init__(settings, client)  # the job thread (jobs.py): notices and releases of requeued jobs
        self.registry = registry or CollectorRegistry()
        self.metrics = ControllerMetrics(self.registry)
        self.store = StateStore(settings.state_dir, persist=not settings.dry_run)
        # Every decision and every hpresilience reason seen, for `hpresilience events` on the head node.
        self.events = EventLog(settings.state_dir, persist=not settings.dry_run)
        # The hpresilience / Action: reason last seen per node out of service (with Slurm's time of it).
        self.seen: Seen = {}
        self.gate = gate or create_gate(settings.gate, GateContext(client, Path(settings.state_dir) / "gates"))
        # Built up front so a bad provider name or option stops the daemon at start, not mid-repair.
        known = provider_registry(settings.providers)
        self.providers: dict[str, Provider] = {
            DEFAULT_GROUP: create_provider(
                settings.default_provider, settings.default_options, ProviderContext(client, DEFAULT_GROUP), known
            )
        }
        for g in settings.groups:
            self.providers[g.name] = create_provider(g.provider, g.options, ProviderContext(client, g.name), known)
        self.records: dict[str, RepairRecord] = {}
        self.inflight: dict[str, Future[Any]] = {}
        self.down_seen: dict[str, float] = {}
        self.pool = ThreadPoolExecutor(max_workers=settings.max_concurrent, thread_name_prefix="repair")
        # Set when a provider call or a gate finishes: the next cycle runs at once instead of a poll later.
        self.wake = threading.Event()
        # When each node's provider call or gate last returned (monotonic): a snapshot of the nodes read before
        # that is stale for it (the slurm gate changes the node's state while it runs).
        self.returned_at: dict[str, float] = {}
        self.last_ok_cycle = 0.0

    def load(self) -> None:
        self.records = self.store.load_all()
        self.seen = self.events.last_marks()
        for rec in self.records.values():
            log.info(
                "repair_record_loaded",
                node=rec.node,
                step=rec.step.value,
                attempt=rec.attempt,
                action=rec.action.value if rec.action else "",
            )

    # -- what the steps read (steps.Repairs) -------------------------------------------------------------
    def active_repairs(self) -> int:
        return sum(1 for r in self.records.values() if r.step in ACTIVE_STEPS)

    def provider_for(self, node: str) -> Provider:
        return self.providers[self._group(node)]

    def come_back_timeout(self, node: str) -> float:
        g = group_for(node, self.settings.groups)
        return (g.come_back_timeout_s if g and g.come_back_timeout_s else None) or self.settings.come_back_timeout_s

    def repairs_since(self, node: str, since: float) -> list[dict[str, Any]]:
        return self.store.repairs_since(node, since)

    def _group(self, node: str) -> str:
        g = group_for(node, self.settings.groups)
        return g.name if g else DEFAULT_GROUP

    def _provider_name(self, group: str) -> str:
        for g in self.settings.groups:
            if g.name == group:
                return g.provider
        return self.settings.default_provider

    # -- one cycle -----------------------------------------------------------------------------------
    def cycle(self, now: float | None = None) -> None:
        started = time.perf_counter()
        read_at = time.monotonic()
        nodes = self.client.nodes_out_of_service(also=list(self.records))
        self.metrics.poll.observe(time.perf_counter() - started)
        self.process(nodes, time.time() if now is None else now, read_at)
        self.last_ok_cycle = time.monotonic()
        self.metrics.last_cycle.set(time.time())

    def process(self, nodes: list[Node], now: float, read_at: float | None = None) -> None:
        """Pick up new requests and advance every repair, from one snapshot of the nodes in trouble (and those
        under repair): a node absent from it is in service, or gone from Slurm if a repair names it. `read_at`
        (monotonic): when the snapshot was read; a repair whose worker returned after that waits a cycle."""
        looks = {n.name: look(n, self.settings) for n in nodes}  # each reason parsed once (selection.look)
        self.seen = self.events.note_reasons(self.seen, list(looks.values()))
        for x in looks.values():
            if x.node.name not in self.records:
                try:
                    self._maybe_pick_up(x, now)
                except ValueError as err:  # a name we cannot use as a file name: skipped, loudly
                    log.error("repair_not_possible", node=x.node.name, error=str(err))
        for name, rec in list(self.records.items()):
            seen_now = looks.get(name)
            if seen_now is None:
                self.apply(rec, Finish("node_gone", "node no longer known to Slurm"), now)
                continue
            fut = self.inflight.get(name)
            stale = read_at is not None and self.returned_at.get(name, float("-inf")) > read_at
            if fut is not None and (not fut.done() or stale):
                continue
            try:
                self.advance(rec, seen_now, now)
            except HPResilienceError as err:  # a refused Slurm write: retried next cycle, never fatal
                self._decision("repair_step_failed", rec, "error", error=str(err))
        for name in [n for n in self.down_seen if n not in looks]:
            del self.down_seen[name]  # back in service: a later DOWN starts its grace afresh
        counts = dict.fromkeys(STEPS, 0)
        for rec in self.records.values():
            counts[rec.step] += 1
        for step, count in counts.items():
            self.metrics.nodes.labels(step.value).set(count)
        self.count_fleet(list(looks.values()))

    def count_fleet(self, looks: list[Look]) -> None:
        """hpr_cluster_nodes{state,owner}: the fleet as dashboards show it, from the same one query."""
        fleet: dict[tuple[str, str], int] = {}
        for x in looks:
            n = x.node
            state = next((f.lower() for f in ("DOWN", "FAIL", "DRAIN") if n.has(f)), None)
            state = state or (n.state_text.split("+")[0] if n.states else "unknown")
            owner = x.reason.owner or ("operator" if n.reason else "none")
            fleet[(state, owner)] = fleet.get((state, owner), 0) + 1
        self.metrics.cluster_nodes.clear()  # a state no node is in any more must not keep its last count
        for (state, owner), count in fleet.items():
            self.metrics.cluster_nodes.labels(state, owner).set(count)

    def _maybe_pick_up(self, x: Look, now: float) -> None:
        node, req = x.node, x.request
        if req is None:
            self.down_seen.pop(node.name, None)
            return
        if req.grace_from is not None:
            since = req.grace_from or self.down_seen.setdefault(node.name, now)
            if now - since < self.settings.down_grace_s:
                return
        group = self._group(node.name)
        rec = RepairRecord(
            node=node.name,
            requested=req.action,
            reason=node.reason,
            provider=self._provider_name(group),
            detected_at=now,
            step_since=now,
            rung=first_rung(list(self.settings.ladder), req.action),
            why=req.why,
        )
        self.records[node.name] = rec
        self.store.save(rec)
        self._decision("repair_detected", rec, state=node.state_text, reason=node.reason, group=group)

    def advance(self, rec: RepairRecord, x: Look, now: float) -> None:
        """Move the repair at most one step: what ends it whatever its step (steps.triage), else its step's
        function, given what its worker returned."""
        t = steps.triage(self, rec, x)
        if t is None and rec.step in STEP_FUNCTIONS:
            fut = self.inflight.pop(rec.node, None)
            returned = None
            if fut is not None:
                err = fut.exception()
                returned = Returned(fut.result() if err is None else None, err)
            t = STEP_FUNCTIONS[rec.step](self, rec, x, returned, now)
        self.apply(rec, t, now)

    # -- the one place a step's value is carried out -------------------------------------------------------
    def apply(self, rec: RepairRecord, t: Transition, now: float) -> None:
        """Carry out what a step returned, in one order (steps.py's table): writes first, so that a write Slurm
        refuses raises before the record changes, and the step runs again next cycle."""
        if isinstance(t, Gated):
            self._gate_returned(rec, t)
            t = t.then
        if isinstance(t, Move):
            if t.failed is not None:
                self.metrics.failures.labels(rec.provider, rec.current.value, t.failed).inc()
            for state, reason in t.marks:
                self._set_state(rec, state, reason)
            if t.update is not None:
                t.update(rec)
            rec.move(t.step, t.why, now)
            self.store.save(rec)
            if t.outcome is not None:
                self.metrics.outcomes.labels(rec.provider, rec.requested.value, t.outcome).inc()
            self._decision(t.event, rec, t.level, **t.extra)
            if t.start is not None:
                self._submit(rec, t.start)
        elif isinstance(t, Finish):
            if t.resume:
                self.client.set_node_state([rec.node], "resume")
                self.metrics.duration.labels(rec.provider, rec.requested.value).observe(max(0.0, now - rec.detected_at))
            rec.why = t.why
            self._finish(rec, t.outcome)
        elif isinstance(t, Note):
            rec.why = t.why
            self._decision(t.event, rec)
        elif isinstance(t, Start):
            self._submit(rec, t.work)

    def _set_state(self, rec: RepairRecord, state: str, reason: str) -> None:
        """`state`: scontrol's word for the node (drain, down), not a repair action."""
        if not self.settings.dry_run:
            self.client.set_node_state([rec.node], state, reason)

    def _gate_returned(self, rec: RepairRecord, g: Gated) -> None:
        result = g.result
        self.metrics.gate.labels("pass" if result.passed else "fail").inc()
        self.events.record(
            "health_gate_passed" if result.passed else "health_gate_failed",
            rec.node,
            "controller",
            result.detail,
            attempt=rec.attempt,
            action=rec.action.value if rec.action else None,
        )

    def _decision(self, event: str, rec: RepairRecord, level: Level = "info", **extra: Any) -> None:
        """One JSON line per step, and the same in the event log."""
        action = rec.action.value if rec.action else None
        log.log(
            level_number(level),
            event,
            node=rec.node,
            step=rec.step.value,
            requested=rec.requested.value,
            action=action,
            attempt=rec.attempt,
            provider=rec.provider,
            why=rec.why,
            dry_run=self.settings.dry_run or None,
            **extra,
        )
        self.events.record(
            event,
            rec.node,
            "controller",
            rec.why,
            step=rec.step.value,
            requested=rec.requested.value,
            action=action,
            attempt=rec.attempt,
            provider=rec.provider,
            **extra,
        )

    def _finish(self, rec: RepairRecord, outcome: str) -> None:
        self.records.pop(rec.node, None)
        if outcome == "repaired":
            self.seen.pop(rec.node, None)  # resumed by us: recorded as node_resumed, not as back_in_service
        self.inflight.pop(rec.node, None)
        self.store.finish(rec, outcome)
        self.metrics.outcomes.labels(rec.provider, rec.requested.value, outcome).inc()
        self._decision(
            "node_resumed" if outcome == "repaired" else "repair_finished",
            rec,
            "info" if outcome == "repaired" else "warning",
            outcome=outcome,
            last_health=rec.last_health,
            took_s=round(time.time() - rec.detected_at, 1),
        )

    def _submit(self, rec: RepairRecord, fn: Callable[..., object], *args: object) -> None:
        def work() -> object:
            try:
                return fn(*args)
            finally:  # before the future reads as done, so no cycle sees it done with an older snapshot
                self.returned_at[rec.node] = time.monotonic()

        fut = self.pool.submit(work)
        fut.add_done_callback(lambda _: self.wake.set())
        self.inflight[rec.node] = fut

    # -- the daemon ----------------------------------------------------------------------------------
    def wait_inflight(self, timeout: float | None = None) -> None:
        for fut in list(self.inflight.values()):
            fut.exception(timeout=timeout)

    def _say_features(self, features: SlurmFeatures | None) -> None:
        """What Slurm offers of its own, for `hpresilience status` (a file) and `hpresilience events`."""
        if features is None:
            return
        self.store.save_features(features.to_json())
        why = ", ".join(features.names()) or "none"
        self.events.record("slurm_features", "", "controller", why, **features.to_json())

    def healthy(self) -> bool:
        return time.monotonic() - self.last_ok_cycle < 3 * self.settings.poll_interval_s + 30

    def run(self, once: bool = False) -> None:
        """Take the lock, then cycle until stopped; `once`: one cycle, plus recording what it started.

        A dry run takes no lock and writes nothing, so it can preview decisions beside the real daemon."""
        if not self.settings.dry_run:
            self.store.lock()
        try:
            self.load()
            log.info(
                "controller_started",
                state_dir=self.settings.state_dir,
                dry_run=self.settings.dry_run,
                under_repair=len(self.records),
                interval_s=self.settings.poll_interval_s,
            )
            notify("READY=1", "STATUS=watching node states")
            self._say_features(self.probe_slurm_features())
            if not self.settings.dry_run and not once:
                self.release_left_to_slurm = (
                    self.settings.release_requeued_every_s > 0 and self.slurm_releases_requeued_jobs() is not None
                )
                self.start_jobs_thread()
            watchdog = watchdog_interval_s()
            while not self.stop_event.is_set():
                try:
                    self.cycle()
                    if once:
                        self.wait_inflight()
                        self.cycle()
                        break
                except Exception as err:  # one bad cycle never ends the daemon
                    self.metrics.cycle_errors.inc()
                    log.error("controller_cycle_failed", error=str(err), kind=type(err).__name__)
                    if once:
                        raise
                notify(f"STATUS={len(self.records)} node(s) under repair")
                if watchdog is not None:
                    notify("WATCHDOG=1")
                self.wake.wait(min(self.settings.poll_interval_s, watchdog or self.settings.poll_interval_s))
                self.wake.clear()
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.store.unlock()
            notify("STOPPING=1")
            log.info("controller_stopped", under_repair=len(self.records))

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()
