"""The restore half of a tiered checkpoint: choose a step every rank can get, bring it within reach, verify,
load; a damaged shard or step is skipped and the next source tried.

TieredCheckpointer owns one `Loader`; every method here is collective over the checkpointer's gloo
groups (`save` for choosing and DCP's read, `repl` for shard transfers).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from hpresilience.errors import HPResilienceError
from hpresilience.fileio import atomic_write
from hpresilience.log import get_logger
from hpresilience.torch import elastic
from hpresilience.torch.durable import DurableTier
from hpresilience.torch.integrity import restore_max_step
from hpresilience.torch.layout import (
    COMMIT,
    METADATA,
    ChecksumError,
    MemoryTier,
    ShardIndex,
    shard_names,
    verify_shard,
)
from hpresilience.torch.private import read_trusted
from hpresilience.torch.reader import TierStorageReader
from hpresilience.torch.replica import recv_files, send_files
from hpresilience.torch.restore import Source, choose_elastic, choose_step, saved_world
from hpresilience.torch.settings import CheckpointConfig
from hpresilience.torch.staleness import behind, stale_against

log = get_logger("hpresilience.torch")


class RestoreRefused(HPResilienceError):
    """A restore would take the job back past a step it has already committed (refuse_restore_behind)."""


class Loader:
    """Restores one rank's state. `flush` is the checkpointer's (pending saves settle before a load looks);
    `prepared` is told each step a load prepared (the checkpointer's last committed step from then on)."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        tier: MemoryTier,
        durable: DurableTier | None,
        *,
        rank: int,
        world: int,
        distributed: bool,
        save_pg: Any,
        repl_pg: Any,
        flush: Callable[[], bool],
        prepared: Callable[[int], None],
    ) -> None:
        self.cfg = cfg
        self.tier = tier
        self.durable = durable
        self.rank = rank
        self.world = world
        self.distributed = distributed
        self._save_pg = save_pg
        self.repl_pg = repl_pg
        self._flush = flush
        self._prepared = prepared
        # Where the last load took this rank's shard from: "own", "peer", "s3"/"filesystem" or "resharded".
        self.last_source: str | None = None
        # Why the last load passed over newer or nearer sources: "step N, rank R from SOURCE: reason".
        self.last_skipped: list[str] = []
        self._last_sources: list[Source] = []  # per rank, of the last same-world step prepared ([] after a reshard)
        # The newest committed step the last load could see when it restored an older one (staleness.py).
        self.last_behind: int | None = None

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (the `save` group)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self._save_pg)
        return out

    def load(self, state_dict: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest step every rank can get (or `step`) into `state_dict`; None if there is none.
        (TieredCheckpointer.load tells the sources.)"""
        bad: set[tuple[int, Source, int]] = set()
        bad_steps: set[int] = set()
        self.last_skipped = []
        while True:
            prepared = self.prepare_load(step, bad, state_dict=state_dict, bad_steps=bad_steps)
            if prepared is None:
                return None
            chosen, reader = prepared
            try:
                dcp_load(state_dict, storage_reader=reader, process_group=self._save_pg)
            except CheckpointException as err:
                # Checksums are verified during the read; a damaged shard fails the load on every rank
                # alike (DCP gathers the failures), and every rank then tries the next source.
                damaged = sorted(r for r, (exc, _) in err.failures.items() if isinstance(exc, ChecksumError))
                if not damaged:
                    raise
                if not self._last_sources:  # a resharding load: a gathered shard is damaged, skip the step
                    bad_steps.add(chosen)
                    self.last_skipped += [
                        f"step {chosen} (resharded), read by rank {r}: {err.failures[r][0]}" for r in damaged
                    ]
                    log.warning("checkpoint_step_skipped", step=chosen, errors=self.last_skipped[-len(damaged) :])
                    continue
                if self.rank in damaged:
                    # Whatever its source, the shard was read from this rank's step folder: drop it, or
                    # the next attempt would take it for an own copy and fail on it again.
                    for name in shard_names(self.rank):
                        (self.tier.step_dir(chosen) / name).unlink(missing_ok=True)
                for r in damaged:
                    bad.add((r, self._last_sources[r], chosen))
                    self.last_skipped.append(
                        f"step {chosen}, rank {r} from {self._name(self._last_sources[r])}: {err.failures[r][0]}"
                    )
                    log.warning("checkpoint_shard_skipped", step=chosen, rank=r, error=str(err.failures[r][0]))
                continue
            finally:
                self.finish_load(chosen)
            return chosen

    def prepare_load(
        self,
        step: int | None = None,
        bad: set[tuple[int, Source, int]] | None = None,
        verify_first: bool = False,
        state_dict: dict[str, Any] | None = None,
        bad_steps: set[int] | None = None,
    ) -> tuple[int, TierStorageReader] | None:
        """Collective: choose the step, bring what this rank needs into reach, verify it; the step and a
        reader for it (None: nothing loadable). `load()` is this plus dcp.load. `state_dict`, when
        given, narrows a resharding load to the saved shards it asks for."""
        self._flush()
        inv = self.tier.inventory(self.rank)
        inv["s3"] = []
        if self.durable is not None and self.rank == 0:
            try:
                inv["s3"] = self.durable.committed_steps()
            except HPResilienceError as err:
                log.warning("durable_listing_failed", tier=self.durable.kind, error=str(err))
        invs = self.gather(inv)
        s3_steps = set(invs[0]["s3"])
        s3_worlds = self._durable_worlds(sorted(s3_steps)[-3:], invs)
        committed = s3_steps.union(*(set(i["committed"]) for i in invs))
        resharded = {s for s in committed if saved_world(s, invs, s3_worlds, self.world) != self.world}
        # After a rollback the wrapper names the newest step a restore may take (torch/integrity.py): newer
        # ones may hold corrupt or diverged state. An explicit `step` is the caller's own choice.
        limit = restore_max_step() if step is None else None
        too_new = {s for s in committed if limit is not None and s > limit}
        if too_new:
            log.warning("checkpoint_steps_past_restore_bound", steps=sorted(too_new), bound=limit)
        if bad is None:
            bad = set()
            self.last_skipped = []
        bad_steps = set() if bad_steps is None else bad_steps
        bad_steps |= too_new
        stale: set[int] = set()
        while True:
            same = choose_step(invs, s3_steps, bad, self.world, step, skip=resharded | too_new | stale)
            other = choose_elastic(invs, s3_steps, s3_worlds, bad_steps, self.world, step)
            if same is None and other is None:
                level = log.warning if committed else log.info
                level("checkpoint_none_loadable", wanted=step, rank=self.rank, committed=sorted(committed))
                return None
            if other is not None and (same is None or other[0] > same[0]):
                chosen, saved, el_sources = other
                problem, dirs = self._materialize_elastic(
                    chosen, saved, el_sources, invs, s3_steps, state_dict, verify_first
                )
                errs = self.gather(problem)
                if not any(errs):
                    break
                bad_steps.add(chosen)
                elastic.cleanup(self, chosen)
                log.warning("checkpoint_step_skipped", step=chosen, errors=[e for e in errs if e])
                self.last_skipped += [f"step {chosen}, saved with {saved} ranks: {e}" for e in errs if e]
                continue
            assert same is not None
            chosen, sources = same
            if self._refused_stale(chosen, sources, inv["own"]):
                stale.add(chosen)
                continue
            problem = self._materialize(chosen, sources, invs, s3_steps, verify_first)
            errs = self.gather(problem)
            if not any(errs):
                dirs = []
                break
            for r, e in enumerate(errs):
                if e:
                    bad.add((r, sources[r], chosen))
                    log.warning("checkpoint_shard_skipped", step=chosen, rank=r, source=sources[r], error=e)
                    self.last_skipped.append(f"step {chosen}, rank {r} from {self._name(sources[r])}: {e}")
        newer = [s for s in inv["own"] if s > chosen]
        if newer and step is None:  # an explicit older step is a choice, not a sign of damage
            log.warning("checkpoint_newer_steps_ignored", steps=newer, reason="not committed or not complete")
        self._check_behind(chosen, committed - stale if step is None else set())
        if dirs:
            self.last_source = "resharded"
            self._last_sources = []
            # Verified while DCP reads what this rank needs (only those bytes are hashed).
            reader = TierStorageReader(self.tier.step_dir(chosen), rank=self.rank, verify=True, shard_dirs=dirs)
        else:
            kind = sources[self.rank][0]
            # "s3" in a source is the durable tier, whichever it is.
            self.last_source = self.durable.kind if kind == "s3" and self.durable is not None else kind
            self._last_sources = sources
            # Items saved by other ranks (DCP keeps one copy of an item every rank saved) are also found
            # in the peer copies this node holds.
            held = [self.tier.peer_dir(src, chosen) for src in self.tier.peer_sources()]
            reader = TierStorageReader(
                self.tier.step_dir(chosen),
                rank=self.rank,
                shard_dirs=[d for d in held if d.is_dir()],
                verify=True,
                fetch_missing=self._s3_fetcher(chosen) if chosen in s3_steps else None,
            )
        log.info("checkpoint_load_prepared", step=chosen, rank=self.rank, source=self.last_source)
        self._prepared(chosen)
        return chosen, reader

    def _refused_stale(self, chosen: int, sources: list[Source], own: list[int]) -> bool:
        """Collective: whether any rank's own shard at `chosen` repeats its previous step's tensors (a stale
        save, staleness.py); such a step is refused on every rank alike."""
        mine = stale_against(chosen, own, self.tier.step_dir, self.rank) if sources[self.rank][0] == "own" else None
        flags = self.gather(mine)
        ranks = [r for r, f in enumerate(flags) if f is not None]
        if not ranks:
            return False
        why = f"stale save: rank {ranks[0]}'s tensors equal its step {flags[ranks[0]]}"
        log.error("checkpoint_stale_step_refused", step=chosen, ranks=ranks, same_as=flags[ranks[0]])
        self.last_skipped.append(f"step {chosen}: {why}")
        return True

    def _check_behind(self, chosen: int, committed: set[int]) -> None:
        """A restore behind the job's committed high-water mark: said, and refused when configured."""
        self.last_behind = behind(chosen, committed)
        if self.last_behind is None:
            return
        log.warning("checkpoint_restore_behind", step=chosen, high_water=self.last_behind, skipped=self.last_skipped)
        if self.cfg.refuse_restore_behind:
            raise RestoreRefused(
                f"restoring step {chosen} would go back past step {self.last_behind}, committed already "
                f"(refuse_restore_behind); passed over: {'; '.join(self.last_skipped) or 'nothing loadable'}"
            )

    def _fetch_dir(self) -> Path:
        """Where this rank puts shards of other ranks it fetched for a load: its own folder, since the
        ranks of one node share the tier; removed when the load is done."""
        return self.tier.base / "s3cache" / f"rank_{self.rank}"

    def finish_load(self, step: int) -> None:
        elastic.cleanup(self, step)
        shutil.rmtree(self._fetch_dir(), ignore_errors=True)
        log.info("checkpoint_loaded", step=step, rank=self.rank, source=self.last_source, skipped=self.last_skipped)

    def _name(self, src: Source) -> str:
        if src[0] == "s3":
            return self.durable.kind if self.durable is not None else "s3"
        return "own memory tier" if src[0] == "own" else f"the peer copy on rank {src[1]}"

    def _materialize_elastic(
        self,
        step: int,
        saved: int,
        sources: list[Source],
        invs: list[dict[str, Any]],
        s3_steps: set[int],
        state_dict: dict[str, Any] | None = None,
        verify_first: bool = False,
    ) -> tuple[str | None, list[Path]]:
        problem = self._ensure_metadata(step, invs, s3_steps)
        problem2, dirs = elastic.gather_shards(self, step, saved, sources, s3_steps, state_dict, verify_first)
        return problem or problem2, dirs

    def _durable_worlds(self, steps: list[int], invs: list[dict[str, Any]]) -> dict[int, int]:
        """World sizes of the durable tier's newest steps that no node's marker told (one GET each, by
        rank 0, shared with every rank); nothing is fetched when the memory tiers know them all."""
        known = {s for inv in invs for s in inv.get("worlds", {})}
        unknown = [s for s in steps if s not in known]
        if not unknown or self.durable is None:
            return {}
        worlds: dict[int, int | None] = {}
        if self.rank == 0:
            worlds = {s: self.durable.world_of(s) for s in unknown}
        if self.distributed:
            box: list[Any] = [worlds]
            dist.broadcast_object_list(box, src=0, group=self._save_pg)
            worlds = box[0]
        return {s: w for s, w in worlds.items() if w is not None}

    def _s3_fetcher(self, step: int) -> Any:
        def fetch(rank: int) -> Path | None:
            assert self.durable is not None
            into = self._fetch_dir() / str(rank)
            self.durable.download_shard(step, rank, into)
            return into

        return fetch

    def _metadata_bytes(self, step: int) -> tuple[bytes, bytes] | None:
        for d in [self.tier.step_dir(step), *(self.tier.peer_dir(s, step) for s in self.tier.peer_sources())]:
            if self.tier.is_committed(d):
                try:
                    return read_trusted(d / METADATA), read_trusted(d / COMMIT)
                except (HPResilienceError, OSError) as err:
                    log.warning("checkpoint_metadata_unreadable", step=step, folder=str(d), error=str(err))
        return None

    def _ensure_metadata(self, step: int, invs: list[dict[str, Any]], s3_steps: set[int]) -> str | None:
        """Put the step's .metadata and COMMIT into this rank's step folder (from a holder or S3)."""
        d = self.tier.step_dir(step)
        d.mkdir(parents=True, exist_ok=True)
        holders = [r for r, i in enumerate(invs) if step in i["committed"]]
        if holders and self.distributed:
            box: list[Any] = [self._metadata_bytes(step) if self.rank == holders[0] else None]
            dist.broadcast_object_list(box, src=holders[0], group=self._save_pg)
            if box[0] is not None and not self.tier.is_committed(d):
                atomic_write(d / METADATA, box[0][0], make_parents=False)
                atomic_write(d / COMMIT, box[0][1], make_parents=False)
        try:
            if not self.tier.is_committed(d):
                if self.durable is None or step not in s3_steps:
                    return "no committed metadata reached this rank"
                self.durable.download_metadata(step, d)
        except (HPResilienceError, OSError) as err:
            return str(err)
        return None

    def _materialize(
        self,
        step: int,
        sources: list[Source],
        invs: list[dict[str, Any]],
        s3_steps: set[int],
        verify_first: bool = False,
    ) -> str | None:
        """Bring this rank's shard and the step's metadata into the own memory tier; check its size, or
        with `verify_first` its checksums (for callers that cannot retry a failed dcp.load)."""
        problem = self._ensure_metadata(step, invs, s3_steps)
        d = self.tier.step_dir(step)
        for r, src in enumerate(sources):  # one transfer at a time, in rank order: no cycles
            if src[0] == "peer" and self.rank in (r, src[1]):
                files = shard_names(r)
                if self.rank == src[1]:
                    send_files(self.repl_pg, [self.tier.peer_dir(r, step) / n for n in files], dst=r)
                else:
                    recv_files(self.repl_pg, [d / n for n in files], src=src[1])
        if problem is not None:
            return problem
        try:
            if sources[self.rank][0] == "s3":
                assert self.durable is not None
                self.durable.download_shard(step, self.rank, d)
            # The checksums are checked while the load reads the bytes (one pass); here only the size.
            data, idx = (d / n for n in shard_names(self.rank))
            index = ShardIndex.from_json(read_trusted(idx), str(idx))
            if verify_first:
                verify_shard(data, index)
            want = index.size
            if data.stat().st_size != want:
                return f"{data}: {data.stat().st_size} bytes, index says {want}"
        except (HPResilienceError, OSError) as err:
            return str(err)
        return None
