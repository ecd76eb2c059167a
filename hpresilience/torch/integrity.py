"""Training that runs but is wrong: the replica check, and what the wrapper tells the ranks after a rollback.

In data-parallel training every replica applies the same averaged gradients to the same parameters, so the
replicas are bit-identical after each optimizer step; a rank whose copy differs was corrupted in place (a bit
flipped in device memory, silent data corruption). Every `every` steps the check reduces each rank's parameters
(and optimizer state) to one digest on the rank's own device, gathers the digests (not the tensors), and finds,
in each replica group, the ranks that disagree with the group's strict majority:

    check = ReplicaCheck(model, optimizer)               # ReplicaCheckConfig(every=100) by default
    for step in ...:
        if should_skip(step, skips): continue           # skips = skip_steps(): HPR_SKIP_STEPS, after a rollback
        ...train...
        heartbeat.beat(step, loss=loss.item())          # the wrapper's NaN / spike watch
        check.maybe(step)                               # collective on the check's steps: every rank calls it

Under `srun --auto-resume=1` rank 0 reports the verdict in a heartbeat line (`replica=ok`, or `replica=bad
bad_rank=R bad_node=N`); the wrapper (autoresume/watch/integrity.py) stops the step, marks a node named twice
Action:Replace, and relaunches with HPR_RESTORE_MAX_STEP, the last step a check passed at, which
TieredCheckpointer.load honours. The digest is a wrapping int64 sum of each tensor's words: one flipped bit
changes it by 2^k, never by 0 (two flips that cancel exactly are not caught). It cannot see corruption in state
that has no replica (a shard of FSDP/ZeRO without HSDP, a tensor-parallel slice): docs/integrity.md.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpresilience.torch import heartbeat
from hpresilience.torch.settings import ReplicaCheckConfig

RESTORE_ENV = "HPR_RESTORE_MAX_STEP"
SKIP_ENV = "HPR_SKIP_STEPS"


def restore_max_step(env: Mapping[str, str] | None = None) -> int | None:
    """The newest step a restore may load (set by the wrapper after a rollback), else None."""
    raw = (os.environ if env is None else env).get(RESTORE_ENV, "").strip()
    return int(raw) if raw.isdigit() else None


def skip_steps(env: Mapping[str, str] | None = None) -> list[tuple[int, int]]:
    """The step ranges the training loop must skip (`A-B,C-D` in HPR_SKIP_STEPS; malformed parts ignored)."""
    out: list[tuple[int, int]] = []
    for part in (os.environ if env is None else env).get(SKIP_ENV, "").split(",")[:1000]:
        a, _, b = part.strip().partition("-")
        if a.isdigit() and b.isdigit() and int(a) <= int(b):
            out.append((int(a), int(b)))
    return out


def should_skip(step: int, ranges: Iterable[tuple[int, int]]) -> bool:
    return any(a <= step <= b for a, b in ranges)


def majority_outliers(digests: Sequence[str], groups: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """(ranks whose digest differs from their group's strict majority, ranks of groups with no majority)."""
    bad: list[int] = []
    undecided: list[int] = []
    for g in groups:
        ranks = [r for r in g if 0 <= r < len(digests)]
        counts: dict[str, int] = {}
        for r in ranks:
            counts[digests[r]] = counts.get(digests[r], 0) + 1
        if len(counts) <= 1:
            continue
        top, n = max(counts.items(), key=lambda kv: kv[1])
        if n * 2 > len(ranks):
            bad += [r for r in ranks if digests[r] != top]
        else:
            undecided += ranks
    return sorted(bad), sorted(undecided)


@dataclass(frozen=True)
class ReplicaVerdict:
    step: int
    bad: list[tuple[int, str]] = field(default_factory=list)  # (rank, node) that disagree with their replicas
    undecided: list[int] = field(default_factory=list)  # ranks of groups with no majority (two replicas differ)

    @property
    def ok(self) -> bool:
        return not self.bad and not self.undecided


def tensor_digest(tensors: Iterable[Any]) -> str:
    """One digest of the tensors' bits: per tensor a wrapping int64 sum of its words, on its own device, one
    copy to the host for all of them."""
    import torch

    sums = []
    for t in tensors:
        flat = t.detach().reshape(-1).contiguous().view(torch.uint8)
        cut = flat.numel() - flat.numel() % 8  # int64 words (fast); the last 0-7 bytes summed on their own
        try:
            head = flat[:cut].view(torch.int64)
        except RuntimeError:  # a view into a flat buffer at an offset that is no multiple of 8: copy it
            head = flat[:cut].clone().view(torch.int64)
        sums.append(head.sum(dtype=torch.int64).reshape(1))
        sums.append(flat[cut:].sum(dtype=torch.int64).reshape(1))
    if not sums:
        return "empty"
    return hashlib.blake2b(torch.cat([s.to("cpu") for s in sums]).numpy().tobytes(), digest_size=16).hexdigest()


class ReplicaCheck:
    """The check for one model (and optimizer); `maybe(step)` runs it on the configured steps (collective)."""

    def __init__(
        self, model: Any, optimizer: Any = None, config: ReplicaCheckConfig | None = None, group: Any = None
    ) -> None:
        import torch.distributed as dist

        self.cfg = config or ReplicaCheckConfig()
        self.model, self.optimizer, self.group = model, optimizer, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        node = (os.environ.get("SLURMD_NODENAME") or socket.gethostname()).split()[0][:64]  # as heartbeat.py
        nodes: list[Any] = [None] * self.world
        dist.all_gather_object(nodes, node, group=group)
        self.nodes = [str(n) for n in nodes]
        self.groups = self.cfg.groups or [list(range(self.world))]
        self.last_ok: int | None = None

    def tensors(self) -> list[Any]:
        out = [p for _, p in sorted(self.model.named_parameters(), key=lambda kv: kv[0])]
        if self.optimizer is not None and self.cfg.optimizer_state:
            import torch

            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    st = self.optimizer.state.get(p, {})
                    out += [st[k] for k in sorted(st) if isinstance(st[k], torch.Tensor)]
        return out

    def maybe(self, step: int) -> ReplicaVerdict | None:
        """On a check step (a multiple of `every`): the verdict, reported to the wrapper by rank 0."""
        return self.check(step) if step % self.cfg.every == 0 else None

    def check(self, step: int) -> ReplicaVerdict:
        import torch.distributed as dist

        digests: list[Any] = [None] * self.world
        dist.all_gather_object(digests, tensor_digest(self.tensors()), group=self.group)
        bad, undecided = majority_outliers([str(d) for d in digests], self.groups)
        verdict = ReplicaVerdict(step, [(r, self.nodes[r]) for r in bad], undecided)
        if verdict.ok:
            self.last_ok = step
        if self.rank == 0:
            hb = heartbeat.default()
            if verdict.ok:
                hb.report(step, replica="ok")
            for r, node in verdict.bad:
                hb.report(step, replica="bad", bad_rank=r, bad_node=node)
            if undecided and not verdict.bad:
                hb.report(step, replica="undecided", bad_rank=undecided[0], bad_node=self.nodes[undecided[0]])
        return verdict
