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

from hpresilience.controller.events import EventLog, Seen
from hpresilience.controller.gates import Gate, GateContext, GateResult, create_gate
from hpresilience.controller.metrics import ControllerMetrics
from hpresilience.controller.notices import JobNotifier
from hpresilience.controller.providers import Provider, ProviderContext, create_provider, provider_registry
from hpresilience.controller.selection import OUT_OF_SERVICE, first_rung, group_for, requested
from hpresilience.controller.settings import ControllerSettings
from hpresilience.controller.state import ACTIVE_STEPS, FOR_A_PERSON, STEPS, RepairRecord, StateStore, Step
from hpresilience.errors import HPResilienceError
from hpresilience.log import Level, get_logger, level_number
from hpresilience.reasons import controller_reason, parse_reason, person_reason
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.jobs import held_among, release_requeued_job, requeued_jobs_held
from hpresilience.slurm.models import Node
from hpresilience.systemd import notify, watchdog_interval_s

log = get_logger("hpresilience.controller")
DEFAULT_GROUP = "default"
# How each step the loop drives is advanced (the steps for a person are only watched, in `advance`).
StepMethod = Callable[["Controller", RepairRecord, Node, float], None]


class Controller:
    def __init__(
        self,
        settings: ControllerSettings,
        client: SlurmClient,
        registry: CollectorRegistry | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
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
        self.stop_event = threading.Event()
        # Set when a provider call or a gate finishes: the next cycle runs at once instead of a poll later.
        self.wake = threading.Event()
        # When each node's provider call or gate last returned (monotonic): a snapshot of the nodes read before
        # that is stale for it (the slurm gate changes the node's state while it runs).
        self.returned_at: dict[str, float] = {}
        self.last_ok_cycle = 0.0
        self.notifier = JobNotifier(client, dry_run=settings.dry_run, watch_every_s=settings.watch_jobs_every_s)
        self._last_scan = time.monotonic()  # the first whole-queue scan comes one release_scan_every_s in
        self._next_notice = self._next_release = 0.0
        # Slurm itself starts requeued jobs as soon as we would (requeue_delay, 25.11+): no releases of ours.
        self.release_left_to_slurm = False

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

    # -- decisions: one JSON line per step -----------------------------------------------------------
    def _decision(self, event: str, rec: RepairRecord, level: Level = "info", **extra: Any) -> None:
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

    def note_reasons(self, nodes: list[Node]) -> None:
        self.seen = self.events.note_reasons(self.seen, nodes)

    def _group(self, node: str) -> str:
        g = group_for(node, self.settings.groups)
        return g.name if g else DEFAULT_GROUP

    def _provider_name(self, group: str) -> str:
        for g in self.settings.groups:
            if g.name == group:
                return g.provider
        return self.settings.default_provider

    def _come_back_timeout(self, node: str) -> float:
        g = group_for(node, self.settings.groups)
        return (g.come_back_timeout_s if g and g.come_back_timeout_s else None) or self.settings.come_back_timeout_s

    def _set_state(self, rec: RepairRecord, state: str, reason: str) -> None:
        """`state`: scontrol's word for the node (drain, down), not a repair action."""
        if not self.settings.dry_run:
            self.client.set_node_state([rec.node], state, reason)

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
        by_name = {n.name: n for n in nodes}
        self.note_reasons(nodes)
        for n in nodes:
            if n.name not in self.records:
                try:
                    self._maybe_pick_up(n, now)
                except ValueError as err:  # a name we cannot use as a file name: skipped, loudly
                    log.error("repair_not_possible", node=n.name, error=str(err))
        for name, rec in list(self.records.items()):
            node = by_name.get(name)
            if node is None:
                rec.why = "node no longer known to Slurm"
                self._finish(rec, "node_gone")
                continue
            fut = self.inflight.get(name)
            stale = read_at is not None and self.returned_at.get(name, float("-inf")) > read_at
            if fut is not None and (not fut.done() or stale):
                continue
            try:
                self.advance(rec, node, now)
            except HPResilienceError as err:  # a refused Slurm write: retried next cycle, never fatal
                self._decision("repair_step_failed", rec, "error", error=str(err))
        for name in [n for n in self.down_seen if n not in by_name]:
            del self.down_seen[name]  # back in service: a later DOWN starts its grace afresh
        counts = dict.fromkeys(STEPS, 0)
        for rec in self.records.values():
            counts[rec.step] += 1
        for step, count in counts.items():
            self.metrics.nodes.labels(step.value).set(count)
        self.count_fleet(nodes)

    def count_fleet(self, nodes: list[Node]) -> None:
        """hpr_cluster_nodes{state,owner}: the fleet as dashboards show it, from the same one query."""
        fleet: dict[tuple[str, str], int] = {}
        for n in nodes:
            state = next((f.lower() for f in ("DOWN", "FAIL", "DRAIN") if n.has(f)), None)
            state = state or (n.state_text.split("+")[0] if n.states else "unknown")
            owner = parse_reason(n.reason).owner or ("operator" if n.reason else "none")
            fleet[(state, owner)] = fleet.get((state, owner), 0) + 1
        self.metrics.cluster_nodes.clear()  # a state no node is in any more must not keep its last count
        for (state, owner), count in fleet.items():
            self.metrics.cluster_nodes.labels(state, owner).set(count)

    def _maybe_pick_up(self, node: Node, now: float) -> None:
        req = requested(node, self.settings)
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

    def advance(self, rec: RepairRecord, node: Node, now: float) -> None:
        parsed = parse_reason(node.reason)
        in_service = not node.states & OUT_OF_SERVICE
        if rec.step in FOR_A_PERSON:
            if in_service:
                rec.why = f"resumed by someone else after the controller left it for a person ({rec.step.value})"
                self._finish(rec, "lemon_cleared" if rec.step is Step.LEMON else "resumed_by_operator")
            elif parsed.owner != "controller" and requested(node, self.settings) is not None:
                rec.why = f"new request: {node.reason}"
                self._finish(rec, "superseded")  # picked up afresh next cycle
            return
        if rec.step is Step.GATING:
            # The slurm gate holds the node in service inside its reservation while its job runs (and after a
            # restart mid-gate until the gate runs again): the gate's result decides, not the node's state.
            self._step_gating(rec, node, now)
            return
        if in_service and rec.step is not Step.ACTING:
            rec.why = f"node back in service without the controller ({node.state_text})"
            self._finish(rec, "resumed_outside_controller")
            return
        still_asked = (
            parsed.action is not None if rec.step is not Step.PENDING else requested(node, self.settings) is not None
        )
        if parsed.owner is None and not still_asked:
            rec.why = f"reason changed by someone else: {node.reason!r}"
            self._finish(rec, "taken_over")
            return
        STEP_METHODS[rec.step](self, rec, node, now)

    # -- steps ---------------------------------------------------------------------------------------
    def _step_pending(self, rec: RepairRecord, node: Node, now: float) -> None:
        if node.is_busy:
            waited = now - rec.detected_at
            if waited >= self.settings.forced_down_after_s and not rec.forced_down:
                reason = controller_reason(f"forced down after {waited:.0f} s waiting for its jobs", rec.requested)
                self._set_state(rec, "down", reason)
                rec.forced_down = True
                rec.move(Step.PENDING, f"forced down after {waited:.0f} s waiting for its jobs", now)
                self.store.save(rec)
                self._decision("node_forced_down", rec, "warning", waited_s=round(waited, 1))
            elif not rec.why.startswith("waiting for its jobs") and not rec.forced_down:
                rec.move(
                    Step.PENDING,
                    f"waiting for its jobs (forced down after {self.settings.forced_down_after_s:g} s)",
                    now,
                )
                self.store.save(rec)
                self._decision("repair_waiting_for_jobs", rec, state=node.state_text)
            return
        busy = sum(1 for r in self.records.values() if r.step in ACTIVE_STEPS)
        if busy >= self.settings.max_concurrent:
            if rec.why != "waiting for a repair slot":
                rec.move(Step.PENDING, "waiting for a repair slot", now)
                self.store.save(rec)
                self._decision("repair_waiting_for_slot", rec, under_repair=busy)
            return
        action = rec.action = self.settings.ladder[rec.rung]
        why = f"{action.value} (attempt {rec.attempt + 1}) via {rec.provider}"
        if self.settings.dry_run:
            if rec.why != f"would {why}":
                rec.why = f"would {why}"
                self._decision("repair_would_start", rec)
            return
        # Drain first: a node that slurmd re-registers must not take jobs before the health gate.
        self._set_state(rec, "drain", controller_reason(f"repairing: {why}", rec.requested))
        rec.attempt += 1
        rec.slurmd_before, rec.boot_before, rec.acted_at = node.slurmd_start_time, node.boot_time, now
        rec.move(Step.ACTING, f"provider asked to {why}", now)
        self.store.save(rec)
        self._decision("repair_action_started", rec, state=node.state_text)
        provider = self.providers[self._group(rec.node)]
        self._submit(rec, provider.act, node, action)

    def _step_acting(self, rec: RepairRecord, node: Node, now: float) -> None:
        fut = self.inflight.pop(rec.node, None)
        if fut is None:
            rec.move(
                Step.WAITING_BACK,
                "controller restarted while the provider acted: waiting for the node rather than acting twice",
                now,
            )
            self.store.save(rec)
            self._decision("repair_action_resumed", rec)
            return
        err = fut.exception()
        if err is not None:
            self._attempt_failed(rec, f"provider {rec.provider} failed: {err}", "provider_error", now)
            return
        rec.move(Step.WAITING_BACK, str(fut.result()), now)
        self.store.save(rec)
        self._decision("repair_action_done", rec)

    def _step_waiting_back(self, rec: RepairRecord, node: Node, now: float) -> None:
        if came_back(node, rec):
            rec.move(Step.GATING, f"slurmd registered again ({node.state_text})", now)
            self.store.save(rec)
            self._decision("node_came_back", rec, waited_s=round(now - (rec.acted_at or now), 1))
            self._start_gate(rec, node)
            return
        limit = self._come_back_timeout(rec.node)
        if now - (rec.acted_at or rec.step_since) > limit:
            self._attempt_failed(rec, f"did not come back within {limit:g} s", "not_back", now)

    def _start_gate(self, rec: RepairRecord, node: Node) -> None:
        self._submit(rec, self.gate.check, node)

    def _submit(self, rec: RepairRecord, fn: Callable[..., object], *args: object) -> None:
        def work() -> object:
            try:
                return fn(*args)
            finally:  # before the future reads as done, so no cycle sees it done with an older snapshot
                self.returned_at[rec.node] = time.monotonic()

        fut = self.pool.submit(work)
        fut.add_done_callback(lambda _: self.wake.set())
        self.inflight[rec.node] = fut

    def _step_gating(self, rec: RepairRecord, node: Node, now: float) -> None:
        fut = self.inflight.pop(rec.node, None)
        if fut is None:  # restarted mid-gate: a health check is safe to run again
            self._start_gate(rec, node)
            return
        err = fut.exception()
        result = fut.result() if err is None else GateResult(False, f"gate error: {err}", 0.0, time.time())
        rec.last_health = result.to_json()
        self.metrics.gate.labels("pass" if result.passed else "fail").inc()
        self.events.record(
            "health_gate_passed" if result.passed else "health_gate_failed",
            rec.node,
            "controller",
            result.detail,
            attempt=rec.attempt,
            action=rec.action.value if rec.action else None,
        )
        if not result.passed:
            self._attempt_failed(rec, f"health gate failed: {result.detail}", "gate_failed", now)
            return
        if parse_reason(node.reason).owner != "controller":
            rec.why = f"health gate passed, but the reason is no longer ours: {node.reason!r}"
            self._finish(rec, "not_resumed_reason_changed")
            return
        earlier = self.store.repairs_since(rec.node, now - self.settings.lemon_window_s)
        if len(earlier) + 1 >= self.settings.lemon_repairs:
            self._leave_for_a_person(rec, earlier, now)
            return
        self.client.set_node_state([rec.node], "resume")
        rec.why = f"health gate passed ({result.detail}); resumed"
        self.metrics.duration.labels(rec.provider, rec.requested.value).observe(max(0.0, now - rec.detected_at))
        self._finish(rec, "repaired")

    def _leave_for_a_person(self, rec: RepairRecord, earlier: list[dict[str, Any]], now: float) -> None:
        """A lemon: the node passes its gate but keeps coming back. It stays drained for a person, with its
        repairs in the reason (Slurm clips reasons at 200 characters: the count comes first)."""
        days = self.settings.lemon_window_s / 86400
        shown = [
            f"{h.get('requested', '?')} {time.strftime('%m-%d %H:%M', time.localtime(h['at']))}" for h in earlier[-4:]
        ] + [f"{rec.current.value} now"]
        text = f"repaired {len(earlier) + 1} times within {days:g} d: {', '.join(shown)}"
        self._set_state(rec, "drain", person_reason(text))
        rec.move(Step.LEMON, f"needs a person: {text}", now)
        self.store.save(rec)
        self.metrics.outcomes.labels(rec.provider, rec.requested.value, "lemon").inc()
        self._decision("node_left_for_a_person", rec, "error", repairs=len(earlier) + 1, last_health=rec.last_health)

    def _attempt_failed(self, rec: RepairRecord, why: str, kind: str, now: float) -> None:
        self.metrics.failures.labels(rec.provider, rec.current.value, kind).inc()
        rec.rung += 1
        if rec.rung < len(self.settings.ladder):
            rec.move(Step.PENDING, f"escalating to {self.settings.ladder[rec.rung].value}: {why}", now)
            self.store.save(rec)
            self._decision("repair_escalated", rec, "warning")
            return
        # What a person must know comes first: Slurm reasons are clipped at 200 characters.
        text = f"needs a person: gave up after {rec.attempt} attempt(s): {why}"
        reason = controller_reason(text)  # no Action: word, so nothing picks it up again by itself
        self._set_state(rec, "down", reason)
        # DOWN alone would be undone by ReturnToService once slurmd answers; DRAIN keeps it out.
        self._set_state(rec, "drain", reason)
        rec.move(Step.GIVEN_UP, text, now)
        self.store.save(rec)
        self.metrics.outcomes.labels(rec.provider, rec.requested.value, "given_up").inc()
        self._decision("repair_given_up", rec, "error", last_health=rec.last_health)

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

    # -- jobs srun --auto-resume requeued --------------------------------------------------------------
    def release_requeued(self, scan: bool = False) -> int:
        """Start every job the wrapper requeued (its comment carries the marker) now: the wrapper asked for
        a requeue because the job cannot go on in place, and Slurm's hold would only add two minutes.
        Looks at the jobs told of a bad node lately, one by one; `scan`: the whole pending queue too."""
        released = 0
        told = self.notifier.recently_told()
        held = held_among(self.client, told)  # each read exactly, by itself (slurm/jobs.py held_job)
        if scan:
            held += requeued_jobs_held(self.client, known=set(told))
        for job in held:
            try:
                release_requeued_job(self.client, job)
            except HPResilienceError as err:
                log.warning("requeued_job_not_released", job_id=job.job_id, error=str(err)[:300])
                continue
            released += 1
            log.info("requeued_job_released", job_id=job.job_id, reason=job.reason)
        return released

    def slurm_releases_requeued_jobs(self) -> int | None:
        """Slurm's own hold on a requeued job when it is no longer than our release interval (the site set
        requeue_delay on 25.11+): then Slurm starts the job as soon as we would, the release thread is not started,
        and the wrapper takes its marker off when the job runs again. None: our release thread is needed."""
        try:
            delay = self.client.requeue_delay_s()
        except HPResilienceError as err:  # an unreadable probe keeps the thread: it is never wrong, only needless
            log.warning("requeue_delay_probe_failed", error=str(err)[:300])
            return None
        if delay is None or delay > self.settings.release_requeued_every_s:
            return None
        log.info(
            "requeue_release_left_to_slurm",
            requeue_delay_s=delay,
            release_requeued_every_s=self.settings.release_requeued_every_s,
        )
        return delay

    def notify_jobs(self, now: float | None = None) -> int:
        """Tell the running jobs on bad nodes (AdminComment), from one read of the nodes out of service."""
        told = self.notifier.notify(self.client.nodes_out_of_service())
        try:
            self.notifier.watch(now)  # leases to the running batch jobs, every watch_jobs_every_s
        except HPResilienceError as err:  # slurmdbd down: no new leases; the wrappers keep polling
            log.warning("job_leases_failed", error=str(err)[:300], kind=type(err).__name__)
        return told

    def jobs_tick(self, now: float) -> tuple[float, float]:
        """One pass of the job thread at monotonic `now`; returns when the next notice and release are due."""
        s = self.settings
        if s.notify_jobs_every_s > 0 and now >= self._next_notice:
            self._next_notice = now + s.notify_jobs_every_s
            try:
                self.notify_jobs(now)
            except HPResilienceError as err:
                log.warning("job_notices_failed", error=str(err)[:300], kind=type(err).__name__)
        if s.release_requeued_every_s > 0 and not self.release_left_to_slurm and now >= self._next_release:
            self._next_release = now + s.release_requeued_every_s
            scan = s.release_scan_every_s > 0 and now - self._last_scan >= s.release_scan_every_s
            if scan:
                self._last_scan = now
            try:
                self.release_requeued(scan=scan)
            except HPResilienceError as err:  # a failed look (slurmctld busy) is retried next time
                log.warning("requeued_jobs_unreadable", error=str(err)[:300], kind=type(err).__name__)
        return self._next_notice, self._next_release

    def start_jobs_thread(self) -> threading.Thread:
        """The job thread on its own (run() starts it; a bench or a test may start it without the cycle)."""
        thread = threading.Thread(target=self._jobs_loop, name="jobs", daemon=True)
        thread.start()
        return thread

    def _jobs_loop(self) -> None:
        """The job thread: notices to jobs on bad nodes, and releases of the jobs their wrappers requeued."""
        self._next_notice = self._next_release = time.monotonic()
        while not self.stop_event.is_set():
            due = [
                t
                for t, every in (
                    (self._next_notice, self.settings.notify_jobs_every_s),
                    (self._next_release, 0 if self.release_left_to_slurm else self.settings.release_requeued_every_s),
                )
                if every > 0
            ]
            if not due:
                return
            if self.stop_event.wait(max(0.0, min(due) - time.monotonic())):
                return
            self.jobs_tick(time.monotonic())

    # -- the daemon ----------------------------------------------------------------------------------
    def wait_inflight(self, timeout: float | None = None) -> None:
        for fut in list(self.inflight.values()):
            fut.exception(timeout=timeout)

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


# The steps the loop drives, each to its one method; the steps for a person have none (`advance` only watches
# them). Checked at import: a step added to Step without a method here fails at once, not mid-repair.
STEP_METHODS: dict[Step, StepMethod] = {
    Step.PENDING: Controller._step_pending,
    Step.ACTING: Controller._step_acting,
    Step.WAITING_BACK: Controller._step_waiting_back,
    Step.GATING: Controller._step_gating,
}


def came_back(node: Node, rec: RepairRecord) -> bool:
    """slurmd registered since the provider acted: a new slurmd start or boot time, and it answers."""
    if node.has("NOT_RESPONDING", "POWERING_UP", "REBOOT_ISSUED") or node.slurmd_start_time is None:
        return False
    return node.slurmd_start_time != rec.slurmd_before or (
        node.boot_time is not None and rec.boot_before is not None and node.boot_time != rec.boot_before
    )
