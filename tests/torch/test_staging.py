"""Staging of async saves: inline into a warm cache, or large tensors in the background behind an
optimizer-step guard. The background copy is slowed down on purpose so that a missing guard would let
the optimizer step change the weights before they are copied, and the test would see it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.optimizer import _global_optimizer_pre_hooks

from hpresilience.torch import CheckpointConfig, TieredCheckpointer
from hpresilience.torch.staging import CachedStager, TornStateError, _stage_tree

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    # 512x512 float32 weight: 1 MiB, copied in the background; BatchNorm statistics: copied inline.
    return nn.Sequential(nn.Linear(512, 512), nn.BatchNorm1d(512))


def _linear(model: nn.Sequential) -> nn.Linear:
    layer = model[0]
    assert isinstance(layer, nn.Linear)
    return layer


def _train_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model.train()
    loss = model(torch.randn(8, 512)).pow(2).mean()  # forward updates BatchNorm statistics in place
    opt.zero_grad()
    loss.backward()
    opt.step()


def _slow_copy(stager: CachedStager, delay: float = 0.5) -> None:
    orig = stager._copy

    def slow(pairs: Any, view: Any) -> Any:
        time.sleep(delay)
        return orig(pairs, view)

    stager._copy = slow  # type: ignore[method-assign]


@pytest.fixture
def bg(tmp_path: Path) -> Iterator[TieredCheckpointer]:
    cfg = CheckpointConfig(namespace="t", memory_dir=str(tmp_path), keep=3, replicate=False, background_staging=True)
    with TieredCheckpointer(cfg) as ck:
        yield ck


def _loaded(ck: TieredCheckpointer, step: int) -> dict[str, torch.Tensor]:
    fresh = _model()
    target = {"model": fresh.state_dict()}
    assert ck.load(target, step) == step
    return {k: v.clone() for k, v in fresh.state_dict().items()}


def test_stage_tree_defers_only_large_plain_tensors_and_keeps_current_python_values() -> None:
    big, small = torch.randn(1024), torch.randn(4)
    src = {"a": big, "b": [small, 7], "c": (torch.tensor(3), "x")}
    cache: dict[str, Any] = {"a": torch.empty(1024), "b": [torch.empty(4), 1], "c": (torch.tensor(0), "old")}
    deferred: list[Any] = []
    view = _stage_tree(src, cache, deferred, inline_below=1024)
    assert [(d is cache["a"], s is big) for d, s in deferred] == [(True, True)]
    assert torch.equal(cache["b"][0], small) and int(cache["c"][0]) == 3
    assert view["b"][1] == 7 and view["c"][1] == "x"
    assert not torch.equal(cache["a"], big)  # not copied yet: that is the worker's job


def test_background_save_returns_before_the_copy_and_optimizer_step_waits_for_it(
    bg: TieredCheckpointer,
) -> None:
    """The checkpoint holds the weights and BatchNorm statistics as they were at the async_save call,
    although the next forward and optimizer step ran while the copy was still going."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    _train_step(model, opt)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _slow_copy(bg._stager)
    fut = bg.async_save({"model": model.state_dict()}, 1)
    pending = bg._stager._pending
    assert pending is not None and not pending.done()
    _train_step(model, opt)
    assert pending.done()  # the step's pre-hook waited
    fut.result()
    assert not torch.equal(_linear(model).weight, before["0.weight"])
    got = _loaded(bg, 1)
    for k, v in before.items():
        assert torch.equal(got[k], v), k


def test_wait_staged_blocks_until_the_copy_is_done(bg: TieredCheckpointer) -> None:
    model = _model()
    saved = _linear(model).weight.detach().clone()
    assert bg.wait_staged() == 0.0
    _slow_copy(bg._stager, 0.3)
    fut = bg.async_save({"model": model.state_dict()}, 1)
    assert bg.wait_staged() > 0.1
    with torch.no_grad():
        _linear(model).weight.add_(1.0)  # safe now: the checkpoint already has its copy
    fut.result()
    assert torch.equal(_loaded(bg, 1)["0.weight"], saved)


def test_failed_background_copy_fails_that_save_and_the_previous_step_stays(
    bg: TieredCheckpointer,
) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    bg.async_save({"model": model.state_dict()}, 1).result()
    first = {k: v.clone() for k, v in model.state_dict().items()}
    orig = bg._stager._copy

    def broken(pairs: Any, view: Any) -> Any:
        raise RuntimeError("pinned allocation failed")

    bg._stager._copy = broken  # type: ignore[method-assign]
    fut = bg.async_save({"model": model.state_dict()}, 2)
    _train_step(model, opt)  # the guard never raises into training
    with pytest.raises(RuntimeError, match="pinned allocation failed"):
        fut.result()
    bg._stager._copy = orig  # type: ignore[method-assign]
    assert bg.load({"model": _model().state_dict()}) == 1
    got = _loaded(bg, 1)
    assert all(torch.equal(got[k], v) for k, v in first.items())
    bg.async_save({"model": model.state_dict()}, 3).result()
    assert torch.equal(_loaded(bg, 3)["0.weight"], _linear(model).weight)


def test_the_optimizer_guard_exists_only_while_a_background_checkpointer_is_open(tmp_path: Path) -> None:
    hooks = _global_optimizer_pre_hooks
    n = len(hooks)
    inline = TieredCheckpointer(
        CheckpointConfig(namespace="a", memory_dir=str(tmp_path), replicate=False, background_staging=False)
    )
    assert len(hooks) == n
    inline.close()
    cfg = CheckpointConfig(namespace="b", memory_dir=str(tmp_path), replicate=False, background_staging=True)
    ck = TieredCheckpointer(cfg)
    assert len(hooks) == n + 1
    ck.close()
    assert len(hooks) == n


def test_inline_staging_is_the_default() -> None:
    assert CheckpointConfig(namespace="d").background_staging is False


def test_in_place_change_during_the_background_copy_fails_that_save_loudly(bg: TieredCheckpointer) -> None:
    """An EMA-style edit outside optimizer.step() while the copy runs: the save is dropped, not torn."""
    model = _model()
    bg.async_save({"model": model.state_dict()}, 1).result()
    before = _linear(model).weight.detach().clone()
    _slow_copy(bg._stager, 0.3)
    fut = bg.async_save({"model": model.state_dict()}, 2)
    with torch.no_grad():
        _linear(model).weight.mul_(0.5)  # not through the optimizer, no wait_staged(): the guard must catch it
    with pytest.raises(TornStateError, match="changed in place while async_save"):
        fut.result()
    assert bg.wait() is False  # the failed save reports through wait() too, without raising
    assert bg.load({"model": _model().state_dict()}) == 1
    assert torch.equal(_loaded(bg, 1)["0.weight"], before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.complex64])
def test_a_tensor_holding_a_nan_saves_in_the_background_and_comes_back_bit_for_bit(
    bg: TieredCheckpointer, dtype: torch.dtype
) -> None:
    """Issue 32: the end-of-copy comparison used torch.equal, and NaN != NaN: every save of a state with a NaN
    (a diverged run's weights, an optimizer's inf/NaN scaler state) failed with a false TornStateError."""
    w = torch.zeros(1 << 19, dtype=dtype)  # >= 1 MiB: copied in the background
    w[7] = float("nan")
    w[9] = float("-inf")
    bg.async_save({"w": w}, 1).result()
    got = {"w": torch.ones_like(w)}
    assert bg.load(got, 1) == 1
    real = torch.view_as_real(w) if w.is_complex() else w
    back = torch.view_as_real(got["w"]) if w.is_complex() else got["w"]
    assert torch.equal(back.view(torch.uint8), real.view(torch.uint8))


def test_a_changed_nan_is_still_a_change() -> None:
    """Bitwise: equal NaNs are the same, a value written over a NaN is not."""
    from hpresilience.torch.staging import _same

    a = torch.tensor([float("nan"), 1.0])
    assert _same(a.clone(), a)
    b = a.clone()
    b[0] = 2.0
    assert not _same(b, a)
    assert not _same(torch.tensor([0.0]), torch.tensor([-0.0]))  # bit for bit, as the checkpoint stores it
