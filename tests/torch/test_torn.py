"""No torn checkpoint by any write path (issue 22, item 2).

Default (inline staging): async_save returns once the whole state is copied, so the checkpoint is the
state at the call whatever the loop writes next: an optimizer step, an in-place op, a `.data` write,
`copy_` under no_grad, nn.init. The background copy is slowed down in every test, so that a default
which copied in the background would store the later writes and fail here.

Background staging (opt-in): the next module forward and optimizer step wait for the copy; an in-place
write by another path fails that save (TornStateError), including a `.data` write to a tensor already
copied (the issue's reproduction: 14 of 32 tensors loaded as zeros).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hpresilience.torch import CheckpointConfig, TieredCheckpointer, TornStateError
from hpresilience.torch.staging import CachedStager

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _model(layers: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(256, 256) for _ in range(layers)))


def _slow(stager: CachedStager, delay: float) -> list[int]:
    """Each background tensor copy waits `delay` first: the window for a racing write is wide open.
    Returns a one-item list counting the copies done."""
    orig = stager._copy_one
    done = [0]

    def slow(dst: torch.Tensor, src: torch.Tensor) -> None:
        time.sleep(delay)
        orig(dst, src)
        done[0] += 1

    stager._copy_one = slow  # type: ignore[method-assign]
    return done


def _opt_step(m: nn.Sequential) -> None:
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    m(torch.randn(2, 256)).sum().backward()
    opt.step()


def _in_place(m: nn.Sequential) -> None:
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(0)


def _data(m: nn.Sequential) -> None:
    for p in reversed(list(m.parameters())):
        p.data.mul_(0)


def _copy_no_grad(m: nn.Sequential) -> None:
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.zeros_like(p))


def _init(m: nn.Sequential) -> None:
    for layer in m:
        assert isinstance(layer.weight, torch.Tensor)
        nn.init.zeros_(layer.weight)


WRITES: dict[str, Callable[[nn.Sequential], None]] = {
    "optimizer_step": _opt_step,
    "in_place_op": _in_place,
    "dot_data": _data,
    "copy_under_no_grad": _copy_no_grad,
    "nn_init": _init,
}


def _ck(tmp_path: Path, **kw: Any) -> TieredCheckpointer:
    cfg = CheckpointConfig(namespace="t", memory_dir=str(tmp_path), keep=3, replicate=False, **kw)
    return TieredCheckpointer(cfg)


@pytest.fixture
def default_ck(tmp_path: Path) -> Iterator[TieredCheckpointer]:
    ck = _ck(tmp_path, inline_staging_below_mib=0)  # background_staging left at its default
    _slow(ck._stager, 0.05)
    yield ck
    ck.close()


@pytest.fixture
def bg_ck(tmp_path: Path) -> Iterator[TieredCheckpointer]:
    ck = _ck(tmp_path, background_staging=True, inline_staging_below_mib=0)
    yield ck
    ck.close()


def _snapshot(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _loaded(ck: TieredCheckpointer, step: int, layers: int = 4) -> dict[str, torch.Tensor]:
    fresh = _model(layers)
    with torch.no_grad():
        for p in fresh.parameters():
            p.fill_(7.0)
    target = {"model": fresh.state_dict()}
    assert ck.load(target, step) == step
    return _snapshot(fresh)


@pytest.mark.parametrize("write", sorted(WRITES))
def test_default_save_holds_the_state_at_the_call_whatever_writes_follow(
    default_ck: TieredCheckpointer, write: str
) -> None:
    m = _model()
    before = _snapshot(m)
    fut = default_ck.async_save({"model": m.state_dict()}, 1)
    WRITES[write](m)
    fut.result()
    assert any(not torch.equal(v, before[k]) for k, v in m.state_dict().items())  # the write happened
    got = _loaded(default_ck, 1)
    assert all(torch.equal(got[k], v) for k, v in before.items())


@pytest.mark.parametrize("write", ["in_place_op", "copy_under_no_grad", "nn_init"])
def test_background_save_racing_a_versioned_write_fails_instead_of_tearing(
    bg_ck: TieredCheckpointer, write: str
) -> None:
    m = _model()
    bg_ck.async_save({"model": m.state_dict()}, 1).result()
    _slow(bg_ck._stager, 0.05)
    fut = bg_ck.async_save({"model": m.state_dict()}, 2)
    WRITES[write](m)
    with pytest.raises(TornStateError):
        fut.result()
    assert bg_ck.wait() is False and bg_ck.load({"model": _model().state_dict()}) == 1


def test_background_save_with_data_writes_meeting_the_copy_midway_fails_instead_of_tearing(
    bg_ck: TieredCheckpointer,
) -> None:
    """The issue's reproduction, scaled down: `.data.mul_(0)` from the last layer while the copy runs
    from the first; `.data` bumps no version counter, the comparison after the copy catches it."""
    m = _model(16)
    copied = _slow(bg_ck._stager, 0.05)
    fut = bg_ck.async_save({"model": m.state_dict()}, 1)
    deadline = time.monotonic() + 10
    while copied[0] < 4 and time.monotonic() < deadline:  # some tensors are copied, most are not
        time.sleep(0.005)
    _data(m)
    with pytest.raises(TornStateError):
        fut.result()
    assert bg_ck.load({"model": _model(16).state_dict()}) is None  # nothing torn was committed


@pytest.mark.parametrize("first", ["forward", "optimizer_step"])
def test_background_copy_finishes_before_the_next_forward_or_optimizer_step(
    bg_ck: TieredCheckpointer, first: str
) -> None:
    m = _model()
    before = _snapshot(m)
    _slow(bg_ck._stager, 0.05)
    fut = bg_ck.async_save({"model": m.state_dict()}, 1)
    pending = bg_ck._stager._pending
    assert pending is not None and not pending.done()
    if first == "forward":
        m(torch.randn(2, 256))
    else:
        torch.optim.SGD(m.parameters(), lr=1.0).step()  # no grads: a no-op step, but the hook runs
    assert pending.done()
    _opt_step(m)
    fut.result()
    got = _loaded(bg_ck, 1)
    assert all(torch.equal(got[k], v) for k, v in before.items())
