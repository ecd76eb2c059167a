"""A survivor's model and optimizer state sent to a new rank, tensor by tensor into the receiver's own tensors
(issue 33: the replacement takes its state from a peer).

Why not one pickled object (broadcast_object_list, what the loop did first): for 256 MiB of parameters with
Adam's two moments (0.75 GiB of state) it took 5.6 s on this machine (median of 5, idle) and raised the
receiver's peak memory by 3.0 GiB (pickle, the wire's byte tensor, unpickled copies, load_state_dict's copy);
tensor by tensor 0.53 s and 0.5 GiB, the new rank's Adam moments themselves (bench/bench_state_transfer.py).

Point to point, per (source, receiver) pair, over the replica group (inprocess.py pairs them, agreement.py):
  1. the source sends the manifest (transferplan.py): names, shapes, dtypes, the non-tensor values, the
     optimizer's param groups;
  2. the receiver lays out where each tensor goes (its own parameters and buffers, in place; its optimizer's
     state, made when it has none) and answers whether its model and optimizer match (StateRefused if not);
  3. on a match, the bytes in units of at most UNIT_BYTES (small tensors of one dtype packed, large ones sliced).
Only receivers get bytes (a broadcast sent every survivor the whole state too). Over gloo (the loop's backend),
which moves host memory only, a GPU tensor goes through two pinned host buffers; on the receiver the copy to the
device of one unit overlaps the receipt of the next. Another backend gets the tensors as they are.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hpresilience.torch.transferplan import Manifest, Piece, fill_tied, manifest_of, plan_units, receiving_layout

UNIT_BYTES = 16 << 20


class StateRefused(Exception):
    """The receiver's model or optimizer does not match the source's state."""


def send_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, to: int, group: Any) -> None:
    """Send this rank's state of `step` to rank `to` (a global rank in `group`)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    manifest, tensors = manifest_of(model.state_dict(), optimizer.state_dict(), params, step)
    dist.send_object_list([manifest], dst=to, group=group)
    answer = torch.zeros(1, dtype=torch.int64)
    dist.recv(answer, src=to, group=group)
    if int(answer) != 1:
        return  # the receiver said why, on its side; the loop decides the same on every rank
    wire = _Wire(group)
    for unit in plan_units(manifest.entries, UNIT_BYTES):
        dist.send(wire.outgoing(tensors, unit), dst=to, group=group)


def receive_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, source: int, group: Any) -> int:
    """Receive rank `source`'s state into this rank's model and optimizer; the step it is of. StateRefused when
    they do not match (the source was told, and sent nothing)."""
    box: list[Any] = [None]
    dist.recv_object_list(box, src=source, group=group)
    manifest = box[0]
    targets: list[torch.Tensor] = []
    why = f"rank {source} sent {type(manifest).__name__}, not a state manifest"
    if isinstance(manifest, Manifest):
        groups = [g["params"] for g in optimizer.param_groups]
        why, targets = receiving_layout(manifest, model.state_dict(), groups, optimizer.state)
    dist.send(torch.tensor([0 if why else 1], dtype=torch.int64), dst=source, group=group)
    if why or not isinstance(manifest, Manifest):
        raise StateRefused(why)
    # A non-contiguous target (rare) is received whole into a contiguous tensor and copied in once at the end, not
    # written through a copy of itself for every unit of it. A tied entry gets no bytes (fill_tied).
    landing = [
        t if t.is_contiguous() or not e.carried else torch.empty(t.shape, dtype=t.dtype, device=t.device)
        for e, t in zip(manifest.entries, targets, strict=True)
    ]
    wire = _Wire(group)
    for unit in plan_units(manifest.entries, UNIT_BYTES):
        buf = wire.incoming(landing, unit)
        dist.recv(buf, src=source, group=group)
        wire.land(buf, landing, unit)
    wire.finish()
    for t, got in zip(targets, landing, strict=True):
        if got is not t:
            t.copy_(got)
    fill_tied(manifest.entries, targets)
    optimizer.load_state_dict(manifest.optimizer_state(targets))
    if manifest.model_values:
        model.load_state_dict(manifest.model_values, strict=False)  # extra state (set_extra_state), not tensors
    return manifest.step


class _Wire:
    """Where one unit's bytes are sent from and received into, and how they reach the target tensors."""

    def __init__(self, group: Any) -> None:
        # gloo reads and writes host memory only; NCCL moves device memory itself.
        self.host_only = dist.get_backend(group) == dist.Backend.GLOO
        self._pinned: list[torch.Tensor | None] = [None, None]
        self._events: list[Any] = [None, None]
        self._slot = 0
        self._staged: int | None = None  # the pinned slot the unit being received went to

    def outgoing(self, tensors: list[torch.Tensor], unit: list[Piece]) -> torch.Tensor:
        """The unit's bytes, from contiguous tensors (manifest_of gives them so)."""
        parts = [tensors[p.index].view(-1)[p.start : p.stop] for p in unit]
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        if self.host_only and out.is_cuda:
            host = self._staging(out.numel(), out.dtype)
            host.copy_(out)  # synchronous: the bytes are on the host before gloo reads them
            return host
        return out.contiguous()

    def incoming(self, targets: list[torch.Tensor], unit: list[Piece]) -> torch.Tensor:
        """A buffer for the unit: the target's own memory when the unit is one slice of one (contiguous) target
        that the backend can write, else a staging buffer (pinned for a GPU target over gloo)."""
        self._staged = None
        first = targets[unit[0].index]
        if len(unit) == 1 and not (self.host_only and first.is_cuda):
            return first.view(-1)[unit[0].start : unit[0].stop]
        numel = sum(p.stop - p.start for p in unit)
        if self.host_only and any(targets[p.index].is_cuda for p in unit):
            self._staged = self._slot
            return self._staging(numel, first.dtype)
        return torch.empty(numel, dtype=first.dtype, device="cpu" if self.host_only else first.device)

    def land(self, buf: torch.Tensor, targets: list[torch.Tensor], unit: list[Piece]) -> None:
        """The received unit into its targets (nothing to do when it was received in place); from a pinned
        buffer the copies to the device are queued, and the buffer is reused once they are done."""
        offset = 0
        for p in unit:
            n = p.stop - p.start
            part, offset = buf[offset : offset + n], offset + n
            dest = targets[p.index].view(-1)[p.start : p.stop]
            if dest.data_ptr() != part.data_ptr() or dest.device != part.device:
                dest.copy_(part, non_blocking=self._staged is not None)
        if self._staged is not None:  # on the stream of the device the copies went to (not the current one)
            device = next(targets[p.index].device for p in unit if targets[p.index].is_cuda)
            self._events[self._staged] = torch.cuda.current_stream(device).record_event()

    def finish(self) -> None:
        for ev in self._events:
            if ev is not None:
                ev.synchronize()

    def _staging(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The next of two pinned host buffers, once the device has taken its previous bytes."""
        slot, self._slot = self._slot, self._slot ^ 1
        if self._events[slot] is not None:
            self._events[slot].synchronize()
            self._events[slot] = None
        nbytes = numel * dtype.itemsize
        pinned = self._pinned[slot]
        if pinned is None or pinned.numel() < nbytes:
            pinned = self._pinned[slot] = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return pinned[:nbytes].view(dtype)
