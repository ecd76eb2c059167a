"""What a state transfer moves and where each byte lands (pure; transfer.py does the sending).

The source describes its state in a Manifest: one Entry per tensor (model parameters and buffers, then the
optimizer's per-parameter state), the non-tensor values beside them, and the optimizer's param groups. Both
sides cut the entries into the same units (plan_units) from the manifest alone, so they agree on every message's
size without asking. The receiver checks the manifest against its own model and optimizer (receiving_layout):
a model that differs is refused with its first difference named, never half loaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch


class Part(Enum):
    MODEL = "model"  # a parameter or buffer, by its state_dict name
    OPTIM = "optim"  # optimizer state of one parameter (its index in the optimizer's numbering)


@dataclass(frozen=True)
class Entry:
    """One tensor of the source's state."""

    part: Part
    name: str
    param: int  # the optimizer's parameter index (-1 for model state)
    shape: tuple[int, ...]
    dtype: torch.dtype
    device_type: str  # where the source holds it ("cpu", "cuda"): units never mix devices
    on_param: bool = True  # optimizer state on its parameter's device (Adam's `step` lives on the CPU)
    same_as: int = -1  # a tied tensor (an embedding shared with the output layer): the entry it is; sent once

    @property
    def carried(self) -> bool:
        return self.same_as < 0 and self.numel > 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Piece:
    """Elements [start, stop) of entry `index`, flattened."""

    index: int
    start: int
    stop: int


@dataclass
class Manifest:
    step: int
    entries: list[Entry]
    param_groups: list[dict[str, Any]]  # the optimizer's, as its state_dict() gives them
    model_values: dict[str, Any] = field(default_factory=dict)  # non-tensor model state (extra state)
    optim_values: dict[int, dict[str, Any]] = field(default_factory=dict)  # non-tensor optimizer state

    def optimizer_state(self, tensors: Sequence[torch.Tensor]) -> dict[str, Any]:
        """The optimizer's state_dict, holding the received tensors (load_state_dict keeps them: same device
        and dtype as their parameters, so it makes no copy)."""
        state: dict[int, dict[str, Any]] = {i: dict(v) for i, v in self.optim_values.items()}
        for entry, t in zip(self.entries, tensors, strict=True):
            if entry.part is Part.OPTIM:
                state.setdefault(entry.param, {})[entry.name] = t
        return {"state": state, "param_groups": self.param_groups}

    @property
    def group_sizes(self) -> list[int]:
        """Parameters per optimizer param group."""
        return [len(g["params"]) for g in self.param_groups]


def manifest_of(
    model_state: Mapping[str, Any], optim_state: Mapping[str, Any], params: Sequence[torch.Tensor], step: int
) -> tuple[Manifest, list[torch.Tensor]]:
    """The manifest of a model's and an optimizer's state_dict() (`params`: the optimizer's parameters in its
    numbering), and the tensors in its entries' order, contiguous (a non-contiguous one, rare, copied once)."""
    entries: list[Entry] = []
    tensors: list[torch.Tensor] = []
    model_values: dict[str, Any] = {}
    # state_dict() names a tied tensor once per module holding it (a 1 GiB embedding twice): one view of the same
    # memory is one entry's bytes.
    seen: dict[tuple[Any, ...], int] = {}
    for name, value in model_state.items():
        if isinstance(value, torch.Tensor):
            i = len(entries)
            key = (value.device, value.data_ptr(), value.dtype, tuple(value.shape), value.stride())
            first = seen.setdefault(key, i) if value.numel() else i
            tied = -1 if first == i else first
            entries.append(
                Entry(Part.MODEL, name, -1, tuple(value.shape), value.dtype, value.device.type, same_as=tied)
            )
            tensors.append(tensors[first] if tied >= 0 else value.detach().contiguous())
        else:
            model_values[name] = value
    optim_values: dict[int, dict[str, Any]] = {}
    for idx, per in optim_state["state"].items():
        for name, value in per.items():
            if isinstance(value, torch.Tensor):
                i = int(idx)
                on_param = 0 <= i < len(params) and value.device == params[i].device
                entries.append(
                    Entry(Part.OPTIM, str(name), i, tuple(value.shape), value.dtype, value.device.type, on_param)
                )
                tensors.append(value.detach().contiguous())
            else:
                optim_values.setdefault(int(idx), {})[str(name)] = value
    manifest = Manifest(step, entries, list(optim_state["param_groups"]), model_values, optim_values)
    return manifest, tensors


def plan_units(entries: Sequence[Entry], unit_bytes: int) -> list[list[Piece]]:
    """Cut the entries into messages of at most unit_bytes (one element at least): consecutive small tensors of
    one dtype and device packed together, a larger one in slices; empty and tied tensors carry nothing."""
    units: list[list[Piece]] = []
    cur: list[Piece] = []
    cur_bytes, cur_kind = 0, None
    for i, e in enumerate(entries):
        size, n = e.dtype.itemsize, e.numel
        if not e.carried:
            continue
        kind = (e.dtype, e.device_type)
        if cur and (kind != cur_kind or cur_bytes + n * size > unit_bytes):
            units.append(cur)
            cur, cur_bytes = [], 0
        if n * size > unit_bytes:
            per = max(1, unit_bytes // size)
            units.extend([Piece(i, a, min(a + per, n))] for a in range(0, n, per))
            continue
        cur.append(Piece(i, 0, n))
        cur_bytes, cur_kind = cur_bytes + n * size, kind
    if cur:
        units.append(cur)
    return units


def receiving_layout(
    manifest: Manifest,
    model_state: Mapping[str, Any],
    groups: Sequence[Sequence[torch.Tensor]],
    optim_state: Mapping[torch.Tensor, Mapping[str, Any]],
) -> tuple[str, list[torch.Tensor]]:
    """Where each entry lands on the receiver: its model's own tensors (state_dict() shares their memory), its
    optimizer's state tensors when they have the entry's shape and dtype, new ones otherwise (a new rank's
    optimizer has no state yet). ("why not", []) when the receiver's model or optimizer differs."""
    own = {k for k, v in model_state.items() if isinstance(v, torch.Tensor)}
    sent = {e.name for e in manifest.entries if e.part is Part.MODEL}
    if own != sent:
        missing, extra = sorted(sent - own)[:3], sorted(own - sent)[:3]
        return f"model tensors differ: the source has {missing} that this rank lacks, this rank has {extra}", []
    sizes = [len(g) for g in groups]
    if sizes != manifest.group_sizes:
        return f"the optimizer's param groups hold {sizes} parameters here, {manifest.group_sizes} at the source", []
    params = [p for g in groups for p in g]
    targets: list[torch.Tensor] = []
    for e in manifest.entries:
        if e.part is Part.MODEL:
            t = model_state[e.name]
            if tuple(t.shape) != e.shape or t.dtype != e.dtype:
                return f"{e.name}: {tuple(t.shape)} {t.dtype} here, {e.shape} {e.dtype} at the source", []
            targets.append(t)
            continue
        if not 0 <= e.param < len(params):
            return f"the source has optimizer state for parameter {e.param}; this optimizer has {len(params)}", []
        p = params[e.param]
        have = optim_state.get(p, {}).get(e.name)
        if not (isinstance(have, torch.Tensor) and tuple(have.shape) == e.shape and have.dtype == e.dtype):
            have = torch.empty(e.shape, dtype=e.dtype, device=p.device if e.on_param else "cpu")
        targets.append(have)
    return "", targets


def fill_tied(entries: Sequence[Entry], targets: Sequence[torch.Tensor]) -> None:
    """After the bytes: a tied entry's target from the one it is tied to, unless they are the same memory here too
    (the same model ties the same tensors; a receiver's model that does not still gets the values)."""
    for e, t in zip(entries, targets, strict=True):
        if e.same_as >= 0 and t.data_ptr() != targets[e.same_as].data_ptr():
            t.copy_(targets[e.same_as])
