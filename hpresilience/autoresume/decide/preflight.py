"""Preflight on a new node set: before a relaunch onto nodes that did not run the previous attempt, one short
collective check across the step's nodes (slurm/preflight.py runs it, torch/preflight.py is its task) finds a new
node that passes its own health checks but cannot communicate, or is slow, and keeps it out of the step.

It costs nothing when the node set did not change (no Slurm call at all), nor on the first attempt (no node is
known good yet to be the hub), nor with `autoresume.preflight: off`. The hub is a node of the previous attempt:
that one communicated. A new node is kept out when (`judge`, pure):
- srun could not start its task, or it did not join the hub within half the bound, or its task failed;
- its transfer did not finish within the bound, or ran below preflight_min_mb_per_s, or took more than
  preflight_slow_factor x the median of the other nodes' transfers (and over NOISE_FLOOR_S: a busy host's
  scheduling jitter is not a slow link).
A node kept out leaves the step as a failed node does (capacity.recover: a hot spare, a grown job, or short per
min_nodes), and the new set is checked again, up to preflight_rounds times. No node is marked in Slurm: the
check names a link, and the link may be the old node's side. A check that says nothing about anyone (no output
from the hub) is `preflight_inconclusive`, and the step goes on: the preflight never stops a job by itself.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpresilience.autoresume.launch.plan import master_port
from hpresilience.autoresume.options import WrapperOptions
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.errors import HPResilienceError
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.preflight import PreflightReport, run_preflight

NOISE_FLOOR_S = 1.0


@dataclass(frozen=True)
class Judgement:
    kept_out: dict[str, str]  # node -> why
    conclusive: bool


def judge(rep: PreflightReport, nodes: Sequence[str], new: Sequence[str], s: AutoResumeSettings) -> Judgement:
    """Which new nodes the report keeps out, and why (the evidence in words). Old nodes are never kept out here:
    they trained in the previous attempt, and a slow old node is the straggler watch's to judge."""
    heard = bool(rep.joined or rep.missing)  # the hub's lines: without them nothing is known of anyone
    why: dict[str, str] = {}
    for n in new:
        t = rep.transfer_s.get(n)
        rest = [v for k, v in rep.transfer_s.items() if k != n]
        if n in rep.srun_failed:
            why[n] = "srun could not start its task"
        elif n in rep.missing or (heard and n not in rep.joined):
            why[n] = f"did not join the hub within {s.preflight_timeout_s / 2:g} s"
        elif rep.missing:
            continue  # the hub stopped the check for a node that did not join: the others' errors follow from it
        elif n in rep.errors:
            why[n] = f"its task failed: {rep.errors[n]}"
        elif n in rep.slow:
            why[n] = f"its {s.preflight_mb:g} MB transfer did not finish in {rep.slow[n]:.1f} s"
        elif t is None:
            if rep.done or (rep.allreduce_s is not None and rep.timed_out):
                why[n] = "no transfer was timed for it"
        elif t > 0 and rep.transfer_mb / t < s.preflight_min_mb_per_s:
            why[n] = f"{rep.transfer_mb / t:.2f} MB/s, under preflight_min_mb_per_s={s.preflight_min_mb_per_s:g}"
        elif rest and t > NOISE_FLOOR_S and t > s.preflight_slow_factor * statistics.median(rest):
            why[n] = f"{t:.2f} s, over {s.preflight_slow_factor:g} x the others' median {statistics.median(rest):.3f} s"
    return Judgement(why, heard or bool(rep.srun_failed))


class Preflight:
    def __init__(
        self,
        client: SlurmClient,
        job_id: int,
        opts: WrapperOptions,
        reporter: Reporter,
        env: dict[str, str],
        recover: Callable[[Sequence[str], Sequence[str], int], list[str]],
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.s = opts.watch
        self.reporter = reporter
        self.env = env
        self.recover = recover  # capacity.recover: the next plan without the nodes kept out (or NoReplacement)
        self.port_span = opts.master_port_span
        self.checks = 0

    def vet(self, plan: list[str], previous: Sequence[str] | None, size: int) -> list[str]:
        """The plan, less the new nodes the check keeps out (replaced as a failed node is); NoReplacement from
        capacity.recover passes through, for the caller's no-replacement path."""
        for _ in range(self.s.preflight_rounds):
            new = [n for n in plan if n not in (previous or ())]
            hubs = [n for n in plan if n in (previous or ())]
            if not self.s.preflight or not new or not hubs:
                return plan
            kept = self._check([hubs[0], *[n for n in plan if n != hubs[0]]], new)
            if not kept:
                return plan
            plan = self.recover(sorted(kept), plan, size)
        # Each round found a bad node and took another: the last replacement launches unchecked (said, not hidden).
        self.reporter.decision("preflight_rounds_spent", nodes=",".join(plan), rounds=self.s.preflight_rounds)
        return plan

    def give_up_s(self) -> float:
        """How long a transfer may take before it is under preflight_min_mb_per_s already (never under the noise
        floor): past that the hub stops waiting, and a capped link costs seconds, not the whole bound."""
        if self.s.preflight_min_mb_per_s <= 0:
            return 0.0
        return max(NOISE_FLOOR_S, self.s.preflight_mb / self.s.preflight_min_mb_per_s)

    def _check(self, nodes: list[str], new: list[str]) -> list[str]:
        started = time.monotonic()
        self.checks += 1
        try:
            hub = self.client.node(nodes[0])
            port = master_port(self.s.master_port_base, self.port_span, self.job_id, self.port_span // 2 + self.checks)
            rep = run_preflight(
                self.client,
                self.job_id,
                nodes,
                hub.address or hub.name,
                port,
                self.s.preflight_timeout_s,
                self.s.preflight_mb,
                self.env,
                give_up_s=self.give_up_s(),
            )
        except HPResilienceError as err:
            self.reporter.decision("preflight_inconclusive", nodes=",".join(nodes), error=str(err)[:300])
            return []
        took = round(time.monotonic() - started, 3)
        verdict = judge(rep, nodes, new, self.s)
        evidence = {
            "hub": nodes[0],
            "took_s": took,
            "joined_s": rep.joined or None,
            "transfer_s": rep.transfer_s or None,
            "transfer_mb": rep.transfer_mb or None,
            "allreduce_s": rep.allreduce_s,
            "timed_out": rep.timed_out or None,
        }
        if not verdict.conclusive:
            self.reporter.decision("preflight_inconclusive", nodes=",".join(nodes), new=",".join(new), **evidence)
            return []
        for node, why in verdict.kept_out.items():
            self.reporter.decision("preflight_node_kept_out", node=node, why=why, nodes=",".join(nodes), **evidence)
        if not verdict.kept_out:
            self.reporter.decision("preflight_passed", nodes=",".join(nodes), new=",".join(new), **evidence)
        return list(verdict.kept_out)
