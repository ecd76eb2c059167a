"""Rank bodies for tests/torch/test_transfer.py (forked by tests/torch/_workers.py's forkserver)."""

from __future__ import annotations

import hashlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpresilience.torch import transfer
from tests.torch._workers import _init


class Tagged(torch.nn.Module):
    """A model with what a state dict can hold besides plain parameters: buffers (one int64), a non-contiguous
    buffer, extra state (a non-tensor value), and a weight tied to another (two names, one tensor)."""

    def __init__(self, width: int, tag: str = "") -> None:
        super().__init__()
        first = torch.nn.Linear(width, width)
        self.body = torch.nn.Sequential(first, torch.nn.BatchNorm1d(width))
        self.head = torch.nn.Linear(width, width, bias=False)
        self.head.weight = first.weight
        self.register_buffer("turned", torch.zeros(width, 3).t())
        self.tag = tag

    def get_extra_state(self) -> Any:
        return {"tag": self.tag}

    def set_extra_state(self, state: Any) -> None:
        self.tag = state["tag"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.body(x))
        return out


def build(width: int, trained: bool, device: str = "cpu") -> tuple[Tagged, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Tagged(width).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if trained:  # the survivor: some steps taken, so its weights, buffers and moments differ from a fresh build
        for i in range(3):
            torch.manual_seed(100 + i)
            opt.zero_grad()
            model(torch.randn(5, width, device=device)).pow(2).sum().backward()
            opt.step()
        opt.param_groups[0]["lr"] = 0.004
        model.get_buffer("turned").add_(torch.arange(3 * width, dtype=torch.float32, device=device).view(3, width))
        model.tag = "trained"
    return model, opt


def digest(model: Tagged, opt: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for v in model.state_dict().values():
        if isinstance(v, torch.Tensor):
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
    for per in opt.state_dict()["state"].values():
        for k in sorted(per):
            h.update(per[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def body(rank: int, world: int, rendezvous: str, base: str, kw: dict[str, Any]) -> None:
    """Rank 0 is the survivor; every other rank receives from it (in rank order), then all take one more step on
    the same batch and report the state's digest."""
    out = Path(base) / f"transfer_{rank}.json"
    res: dict[str, Any] = {}
    try:
        _init(rank, world, rendezvous, 30.0)
        transfer.UNIT_BYTES = kw.get("unit_bytes", transfer.UNIT_BYTES)
        width = kw["width"] + (1 if rank in kw.get("different", ()) else 0)
        device = kw.get("device", "cpu")
        model, opt = build(width, trained=rank == 0, device=device)
        if rank == 0:
            for r in range(1, world):
                transfer.send_state(model, opt, 42, r, None)
        else:
            try:
                res["step"] = transfer.receive_state(model, opt, 0, None)
            except transfer.StateRefused as why:
                res["refused"] = str(why)
        res["received_digest"] = digest(model, opt)
        res["lr"] = opt.param_groups[0]["lr"]
        res["tag"] = model.tag
        res["tied"] = model.head.weight is model.get_parameter("body.0.weight")
        res["devices"] = sorted({t.device.type for t in model.state_dict().values() if isinstance(t, torch.Tensor)})
        if "refused" not in res:
            torch.manual_seed(7)
            opt.zero_grad()
            model(torch.randn(5, width).to(device)).pow(2).sum().backward()
            opt.step()
            res["after_step_digest"] = digest(model, opt)
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent through the result file
        res["error"] = traceback.format_exc()
    out.write_text(json.dumps(res))
    sys.exit(0)
