"""Recovery without rollback (`srun --auto-resume=1 --auto-resume-mode=inprocess`; issue 33).

The job runs one step per node (launch/pernode.py). On a node fault (the node watch's bad node: an operator's
`Action:Replace`, the controller's mark, Slurm's DOWN/FAIL) or a node's step ending badly, only that node's step is
cancelled; the replacement comes from the same capacity code as the relaunch path (decide/capacity.py: a hot
spare, or a grown job), the new world is written to the world file (hpresilience/torch/world.py), and the
replacement's step is launched into it. The survivors' processes are never touched: their library loop
(hpresilience/torch/inprocess.py) sees the collective fail or the new generation, builds a new process group from
the world file, agrees on the last completed step and hands its state to the new ranks.

What this mode does not do (yet) falls back to the relaunch path, said in the events (`inprocess_fallback`): a
survivor whose slot would change, a rank that exits with EXIT_INPROCESS_GAVE_UP (it could not finish its part of
the recovery: no replica of a lost shard, no world within its bound), a step that ends badly on a node that is
not replaced, a second fault while a recovery still runs, a recovery past its bound (inprocessguard.py), a hang
whose evidence names no single node. A hang that names one node (a stopped rank holds every survivor in its
all-reduce) is a node fault here (inprocess_watch.py). Log rules and straggler detection are the relaunch path's
and are not run here.
"""

from __future__ import annotations

import signal
import time

from hpresilience.autoresume.decide.capacity import BatchHostLost, NoReplacement
from hpresilience.autoresume.decide.classify import Cause
from hpresilience.autoresume.decide.ending import unanswering
from hpresilience.autoresume.decide.rejoin import EndedSteps, sort_ended
from hpresilience.autoresume.decide.spares import SpareRefill
from hpresilience.autoresume.decide.verdicts import KIND_OF, OUTCOME_OF, Outcome
from hpresilience.autoresume.inprocess_watch import InProcessHangs
from hpresilience.autoresume.inprocessguard import RecoveryGuard
from hpresilience.autoresume.launch.pernode import NodeSteps, StepCommand, node_step_env
from hpresilience.autoresume.launch.plan import AttemptLaunch, master_port, plan_nodes
from hpresilience.autoresume.launch.standby import Standbys
from hpresilience.autoresume.supervisor import Supervisor
from hpresilience.autoresume.watch.base import Act
from hpresilience.autoresume.watch.nodefaults import NodeFaults
from hpresilience.autoresume.watch.stallwatch import StalledStep
from hpresilience.torch.world import EXIT_INPROCESS_GAVE_UP, World, write_world

POLL_S = 0.1
# A node that left the job unanswering and came back: a step of it that ends this soon after is taken for
# Slurm's delayed termination of the job there (_relaunch_slots), not for an application error.
REJOIN_ABORT_S = 120.0
# A slot is started again at most this many times per return.
REJOIN_RELAUNCHES = 3
# slurmd ends the job's termination on a node only at a look that finds no step of the job there, looking at most
# 10 s apart (pause_for_job_completion, slurmd's req.c in 22.05, slurmd_common.c since): any step of the job there
# at a look, the relaunched one or a short probe of ours, is killed and the termination goes on. So nothing is
# launched on the node for this long before its slot's step is started again.
REJOIN_QUIET_S = 11.0
MODE = "inprocess"


class Fallback(Exception):
    """In-process recovery cannot go on: the relaunch path takes over (why: the message)."""


class InProcessLoop:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.opts = sup.opts
        self.reporter = sup.reporter
        # Training steps and standby steps feed the one progress stream: once assigned, a standby's ranks are seen
        # training (and named, by pid) by their heartbeats, as any rank; before, a standby prints no progress.
        out = (sup.client, sup.job_id, sup.feed, sup.steps.stdout, sup.steps.stderr, self.opts.max_line_bytes)
        self.steps = NodeSteps(*out, sup.progress)
        self.world_file = str(self.opts.state_dir / f"{sup.job_id}.world.json")
        self.tasks_per_node = self.opts.srun.tasks_per_node()
        srun = self.opts.srun
        args = (tuple(srun.passthrough), tuple(srun.command), srun.export)
        self.command = StepCommand(self.opts.srun_bin, sup.job_id, self.tasks_per_node, *args)
        warm = self.opts.watch.standby == "spares"
        self.standbys = Standbys(NodeSteps(*out, sup.progress), sup.reporter, warm, self.command, self.world_file)
        watch = self.opts.watch
        self.refill = SpareRefill(
            sup.capacity, sup.reporter, self.opts.spares, watch.refill_spares, watch.spare_check_s, self.standbys.stop
        )
        self.base_env: dict[str, str] = {}  # the steps' environment at the last world written (a refill's standby)
        self.faults = NodeFaults(sup.nodewatch, sup.reporter, self.opts.poll_interval_s)
        self.hangs = None
        if self.opts.hang_detection:
            self.hangs = InProcessHangs(
                self.opts, sup.progress, sup.investigator, sup.reporter, sup.ending.mark_suspect
            )
            sup.env.update(InProcessHangs.step_env(self.opts))  # every node's step inherits it (_announce)
        # A node that dies with its slurmstepd leaves its srun waiting for Slurm's DOWN: the whole world goes silent
        # at once. The relaunch path's stall watch asks every node after a few step intervals (3 s probe), where
        # the hang watch would wait for its floor and its evidence probe (~22 s measured).
        self.stall = None
        if self.opts.watch.silent_step_s > 0:
            self.stall = StalledStep(
                self.opts.watch.silent_step_s, sup.progress, sup.reporter, sup.client, sup.job_id, sup.env
            )
        self.left_unanswering: set[str] = set()  # nodes that left the job unanswering (dead, cut off)
        self.rejoined: dict[str, tuple[float, int]] = {}  # such nodes back in the world: when, relaunches since
        self.generation = 0
        self.plan: list[str] = []
        self.size = 0
        self.guard = RecoveryGuard(self.world_file, self.opts.watch.inprocess_recovery_s, sup.reporter)

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> int:
        """The job step's exit code; on a fallback, the relaunch path's."""
        try:
            return self._run()
        except Fallback as why:
            self.steps.stop_all()
            self.standbys.stop_all()
            self.reporter.decision("inprocess_fallback", why=str(why), generation=self.generation)
            self.sup.state.last_nodes = list(self.plan)
            # The step's size as it started: the allocation may have shrunk off a replaced node since, and the
            # relaunch path would otherwise size the step from what is left less the spares (one node short).
            self.sup.size = self.size
            return Supervisor._run(self.sup)
        except NoReplacement as err:
            self.steps.stop_all()
            return self.sup._no_replacement(str(err), batch_host=isinstance(err, BatchHostLost))
        finally:
            self.steps.stop_all()
            self.standbys.stop_all()

    def _run(self) -> int:
        job = self.sup.client.job(self.sup.job_id)
        self.size = self.opts.step_size(len(job.nodes))
        plan = plan_nodes(job.nodes, self.size, self.sup.capacity.unhealthy(job))
        self.plan = plan if plan is not None else self.sup.capacity.recover([], [], self.size)
        self._announce(self.plan, new_slots=list(range(len(self.plan))), first=True)
        self._watch_world([])
        finished: set[str] = set()
        while (rc := self._look(finished)) is None:
            time.sleep(POLL_S)
        return rc

    def _look(self, finished: set[str]) -> int | None:
        """One look at the world and what it calls for; the job step's exit code once it is over."""
        if self.sup.stop_request.signum:
            sig = self.sup.stop_request.signum
            self.reporter.decision("supervisor_stopped", signal=signal.Signals(sig).name, mode=MODE)
            return 128 + sig
        failed: dict[str, str] = {}
        ended: dict[str, int] = {}
        for node, rc in self.steps.ended().items():
            if rc == 0:
                finished.add(node)
            elif rc == EXIT_INPROCESS_GAVE_UP:
                raise Fallback(f"a rank on {node} could not finish the in-process recovery")
            else:
                ended[node] = rc
        if not ended and not self.steps.running and finished >= set(self.plan):
            self.sup.state.finished, self.sup.state.exit_code = True, 0
            self.reporter.decision("job_step_succeeded", mode=MODE, generation=self.generation)
            return 0
        verdict = self.faults.poll(time.monotonic(), self._view())
        if verdict is not None and verdict.act is Act.STOP_NOW:
            for node in verdict.nodes:
                failed.setdefault(node, verdict.why)
        if ended:
            failed.update(self._dead(ended, finished))
            if not failed:
                # _dead may have waited out REJOIN_QUIET_S, in which the other nodes can finish the training: their
                # steps' ends are looked at before a watch judges a silence that the wait made (seen: 13 s of it
                # taken for a hang with every rank exited, and a finished job relaunched).
                return None
        if not failed:
            failed.update(self._stalled())
        if not failed:
            failed.update(self._hung())
        if failed:
            self._watch_world(self._replace(failed, finished))
        elif (why := self.guard.poll()) is not None:
            raise Fallback(why)
        elif self.guard.pending is None:  # between faults: no Slurm call slows a recovery
            self.standbys.start(
                self.refill.poll(time.monotonic(), self.plan, self.left_unanswering), self.base_env, self.generation
            )
        return None

    def _hung(self) -> dict[str, str]:
        """A hang that names one node, as a node fault (inprocess_watch.py); one that names none: Fallback."""
        hung = self.hangs.poll(time.monotonic(), self._view()) if self.hangs is not None else None
        if hung is None:
            return {}
        if hung.node is None:
            raise Fallback(hung.why)
        return {hung.node: hung.why}

    def _stalled(self) -> dict[str, str]:
        """The whole world silent and some of its nodes not answering (watch/stallwatch.py): those nodes."""
        verdict = self.stall.poll(time.monotonic(), self._view()) if self.stall is not None else None
        if verdict is None or verdict.act is not Act.STOP_NOW or not verdict.nodes:
            return {}
        self.sup.capacity.mark_unanswering(list(verdict.nodes))
        self.left_unanswering.update(verdict.nodes)
        return {n: verdict.why for n in verdict.nodes}

    def _watch_world(self, new_slots: list[int]) -> None:
        for slot in new_slots:
            if self.plan[slot] in self.left_unanswering:
                self.left_unanswering.discard(self.plan[slot])
                self.rejoined[self.plan[slot]] = (time.monotonic(), 0)
        if self.stall is not None:
            self.stall.start(self._view())
        if self.hangs is not None:
            self.hangs.new_world(self.generation, self.plan, self.tasks_per_node, new_slots)

    def _dead(self, ended: dict[str, int], finished: set[str]) -> dict[str, str]:
        """A node whose step ended badly: replaced when it runs no task (a dead node: its slurmd is gone long
        before Slurm's SlurmdTimeout says so; released from the job while Slurm still calls it responding, as any
        unanswering node is: capacity.mark_unanswering);
        a node that answers had an application error, which is the relaunch path's to weigh."""
        nodes = sorted(ended)
        dead = unanswering(self.sup.client, self.reporter, self.sup.job_id, nodes, self.sup.env, mode=MODE)
        seen_at = time.monotonic()
        steps = self._sort_ended([n for n in nodes if n not in dead], finished, seen_at)
        if steps.failed:
            codes = ",".join(f"{n}:{ended[n]}" for n in steps.failed)
            raise Fallback(f"step(s) ended badly on node(s) that answer ({codes}): an application error")
        if steps.again:  # a relaunch waits (_quiet); meanwhile the other nodes may finish the training
            self._quiet(steps.again)
            steps = self._sort_ended(steps.again, finished, seen_at)  # judged as of the end seen: none fails now
        if steps.finished:
            finished.update(steps.finished)
            self.reporter.decision(
                "inprocess_step_ended_after_training",
                nodes=",".join(steps.finished),
                exit_codes=",".join(f"{n}:{ended[n]}" for n in steps.finished),
                why="every other node finished the training; the job's delayed termination reached this one's step",
            )
        if steps.again:
            self._relaunch_slots(steps.again, ended)
        self.sup.capacity.mark_unanswering(dead)
        self.left_unanswering.update(dead)
        return {n: f"its step ended with exit status {ended[n]} and it runs no task" for n in dead}

    def _sort_ended(self, answering: list[str], finished: set[str], seen_at: float) -> EndedSteps:
        """rejoin.sort_ended, counting as finished the steps that have exited 0 but were not looked at yet."""
        done = finished | {n for n, step in self.steps.running.items() if step.process.poll() == 0}
        return sort_ended(answering, self.rejoined, done, self.plan, seen_at, REJOIN_ABORT_S, REJOIN_RELAUNCHES)

    def _relaunch_slots(self, nodes: list[str], ended: dict[str, int]) -> None:
        """A node that left the job unanswering and was taken back (repaired): slurmctld still holds the job's
        termination for it, sent when its agent retries (measured: 38 s after the node answered again), and
        slurmd then aborts every step of the job there, the new one too (`job_manager exiting with aborted
        job`). Not the training's fault: the slots' ranks start again on the same nodes, state from a peer."""
        for node in nodes:
            at, tries = self.rejoined[node]
            self.rejoined[node] = (at, tries + 1)
            self.steps.stop(node)
        # Not a second fault, even while a recovery runs (the abort came 18.8 s into one, before the world formed):
        # the slots' new ranks had no state yet, the survivors keep theirs and join the newer world.
        # slurmd goes on ending the job there and kills every step of the job it finds at its next look: the
        # caller has waited without launching anything there (_quiet; probing for its old steps kept the
        # termination going: seen, a step killed twice after 10 s of probes every 0.7 s).
        new_slots = [self.plan.index(n) for n in nodes]
        self._announce(self.plan, new_slots)
        self.guard.recovering(self.generation)
        self._watch_world(new_slots)
        self.reporter.decision(
            "inprocess_step_relaunched",
            generation=self.generation,
            nodes=",".join(nodes),
            exit_codes=",".join(f"{n}:{ended[n]}" for n in nodes),
            why="the job's termination on a node that had left it unanswering reached its new step",
        )

    def _quiet(self, nodes: list[str]) -> None:
        """REJOIN_QUIET_S with nothing launched on `nodes` (the loop's watches are not polled meanwhile either:
        the stall watch would probe them); a stop request ends it."""
        started = time.monotonic()
        while time.monotonic() - started < REJOIN_QUIET_S and not self.sup.stop_request.signum:
            time.sleep(POLL_S)
        self.reporter.decision(
            "returned_nodes_left_quiet", nodes=",".join(nodes), took_s=round(time.monotonic() - started, 3)
        )

    def _replace(self, failed: dict[str, str], finished: set[str]) -> list[int]:
        """Replace the failed nodes' steps in the running world (Fallback when that cannot be done); the slots
        given new ranks."""
        started = time.monotonic()
        self.reporter.decision(
            "fault_seen",
            cause=Cause.HARDWARE.value,
            mode=MODE,
            nodes=",".join(sorted(failed)),
            detail="; ".join(f"{n}: {why}" for n, why in sorted(failed.items()))[:300],
        )
        stopped = {node: self.steps.stop(node) for node in failed}
        if (why := self.guard.second_fault(sorted(failed))) is not None:
            raise Fallback(why)
        decision = self.sup.policy.decide(KIND_OF[Cause.HARDWARE], 1)
        self.reporter.decision("policy_decided", action=decision.choice.value, reason=decision.reason, mode=MODE)
        if OUTCOME_OF[decision.choice] is not Outcome.RELAUNCH:
            raise Fallback(f"the restart policy says {decision.choice.value}: {decision.detail}")
        # A failed node's own step may have ended with 0 first: srun says `Node failure on n2` and exits 0 when
        # the controller forces the node down (seen on 22.05). That node did not finish the training.
        finished -= set(failed)
        if finished:
            raise Fallback(f"node(s) {','.join(sorted(finished))} already finished the step")
        plan = self.sup.capacity.recover(sorted(failed), self.plan, self.size)
        if len(plan) != len(self.plan):  # running short (min_nodes): the world's size would change
            self.plan = plan
            raise Fallback(f"the step would run on {len(plan)} node(s), not {len(self.plan)}")
        moved = [n for slot, n in enumerate(self.plan) if n not in failed and plan[slot] != n]
        if moved:
            self.plan = plan
            raise Fallback(f"survivor(s) {','.join(moved)} would change slots in {','.join(plan)}")
        # A failed node repaired fast enough is its own replacement (back under its name, in its slot, as
        # HyperPod's replacement is): its slot gets new ranks all the same.
        new_slots = [slot for slot, n in enumerate(plan) if n != self.plan[slot] or n in failed]
        self.sup.state.count_restart(Cause.HARDWARE.value)
        self.sup.reporter.count_restart(Cause.HARDWARE.value)
        self.plan = plan
        self._announce(plan, new_slots)
        self.guard.recovering(self.generation)
        self.reporter.decision(
            "inprocess_replaced",
            generation=self.generation,
            replaced=",".join(sorted(failed)),
            nodes=",".join(plan),
            steps_cancelled=",".join(s for _, ids in stopped.values() for s in ids) or None,
            took_s=round(time.monotonic() - started, 3),
        )
        return new_slots

    # -- worlds --------------------------------------------------------------------------------------
    def _announce(self, plan: list[str], new_slots: list[int], first: bool = False) -> None:
        """Write generation+1's world, then give each new slot its step: a warm standby already running on its
        node (the world written is its assignment), else a step launched into the world (it reads it at start).
        Then a standby on each spare that has none (launch/standby.py)."""
        self.generation += 1
        launch = self._launch(plan)
        tpn = self.tasks_per_node
        new_ranks = () if first else tuple(r for slot in new_slots for r in range(slot * tpn, (slot + 1) * tpn))
        world = World(self.generation, tuple(plan), launch.master_addr, launch.master_port, tpn, new_ranks)
        write_world(self.world_file, world)
        self.sup.state.attempts += 1
        self.sup.state.last_nodes = list(plan)
        self.sup.reporter.set_attempts(self.sup.state.attempts)
        self.reporter.decision(
            "inprocess_world_written",
            generation=self.generation,
            nodes=",".join(plan),
            master_addr=world.master_addr,
            master_port=world.master_port,
            world_size=world.world_size,
            new_ranks=",".join(map(str, new_ranks)) or None,
            path=self.world_file,
        )
        base = launch.environment(self.sup.env, self.sup.state.restarts)
        for slot in new_slots:
            node = plan[slot]
            warm = self.standbys.take(node)
            if warm is not None:
                self.steps.adopt(warm)
                continue
            name = f"hpr-inprocess-{self.sup.job_id}-g{self.generation}-{node}"
            env = node_step_env(base, self.world_file, slot, tpn, self.generation)
            self.steps.start(node, name, self.command.argv(node, name, env), env)
        spares = self.standbys.spares(self.sup.client, launch.allocation, plan, self.sup.state.kept_out)
        self.standbys.start(spares, base, self.generation)
        self.base_env = base
        self.sup._save()

    def _launch(self, plan: list[str]) -> AttemptLaunch:
        first = self.sup.client.node(plan[0])
        return AttemptLaunch(
            attempt=self.generation,
            nodes=tuple(plan),
            allocation=tuple(self.sup.client.job(self.sup.job_id).nodes),
            master_addr=first.address or first.name,
            master_port=master_port(
                self.opts.master_port_base, self.opts.master_port_span, self.sup.job_id, self.sup.state.attempts + 1
            ),
            tasks_per_node=self.tasks_per_node,
            job_marker=str(self.sup.job_id),
            requested=self.size,
        )

    def _view(self) -> AttemptLaunch:
        """What the node detector needs of the running world (its nodes)."""
        return AttemptLaunch(
            attempt=self.generation,
            nodes=tuple(self.plan),
            allocation=tuple(self.plan),
            master_addr="",
            master_port=0,
            tasks_per_node=self.tasks_per_node,
            requested=self.size,
        )


class InProcessSupervisor(Supervisor):
    """The supervisor with the in-process loop in place of the relaunch loop (which stays its fallback)."""

    def _run(self) -> int:
        return InProcessLoop(self).run()
