"""What a state transfer moves and where it lands (hpresilience/torch/transferplan.py): pure, no process group."""

from __future__ import annotations

import pytest
import torch

from hpresilience.torch.transferplan import (
    Entry,
    Manifest,
    Part,
    fill_tied,
    manifest_of,
    plan_units,
    receiving_layout,
)


def _entry(numel: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Entry:
    return Entry(Part.MODEL, f"t{numel}", -1, (numel,), dtype, device)


def _adam(width: int = 4, stepped: bool = True) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if stepped:
        model(torch.randn(3, width)).sum().backward()
        opt.step()
    return model, opt


def _manifest(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[Manifest, list[torch.Tensor]]:
    params = [p for g in opt.param_groups for p in g["params"]]
    return manifest_of(model.state_dict(), opt.state_dict(), params, 7)


def test_small_tensors_of_one_dtype_share_a_unit_and_a_dtype_change_starts_a_new_one() -> None:
    entries = [_entry(10), _entry(20), _entry(5, torch.int64), _entry(3, torch.int64), _entry(4)]
    units = plan_units(entries, 1024)
    assert [[p.index for p in u] for u in units] == [[0, 1], [2, 3], [4]]
    assert all(p.start == 0 and p.stop == entries[p.index].numel for u in units for p in u)


def test_a_unit_closes_before_it_would_pass_the_limit() -> None:
    units = plan_units([_entry(100), _entry(100), _entry(100)], 800)  # 400 bytes each: two fit, not three
    assert [[p.index for p in u] for u in units] == [[0, 1], [2]]


def test_a_tensor_larger_than_a_unit_is_sliced_and_every_element_is_sent_once() -> None:
    units = plan_units([_entry(3), _entry(1000), _entry(2)], 256)  # 64 floats per unit
    big = [p for u in units for p in u if p.index == 1]
    assert all(len(u) == 1 for u in units if u[0].index == 1)  # a slice travels alone
    assert [(p.start, p.stop) for p in big][:2] == [(0, 64), (64, 128)] and big[-1].stop == 1000
    covered = [i for p in big for i in range(p.start, p.stop)]
    assert covered == list(range(1000))


def test_empty_tensors_carry_nothing_and_cuda_tensors_are_never_packed_with_host_ones() -> None:
    units = plan_units([_entry(0), _entry(4, device="cuda"), _entry(4)], 1024)
    assert [[p.index for p in u] for u in units] == [[1], [2]]


def test_a_new_optimizer_gets_fresh_state_tensors_of_the_sources_shapes_and_the_model_its_own_tensors() -> None:
    manifest, sent = _manifest(*_adam())
    model, opt = _adam(stepped=False)
    own = model.state_dict()
    why, targets = receiving_layout(manifest, own, [g["params"] for g in opt.param_groups], opt.state)
    assert why == "" and len(targets) == len(sent)
    for e, t, s in zip(manifest.entries, targets, sent, strict=True):
        assert t.shape == s.shape and t.dtype == s.dtype
        if e.part is Part.MODEL:  # written in place: the model's own memory
            assert t.data_ptr() == own[e.name].data_ptr()
    steps = [t for e, t in zip(manifest.entries, targets, strict=True) if e.name == "step"]
    assert steps and all(t.device.type == "cpu" and t.dim() == 0 for t in steps)


def test_an_optimizer_that_has_state_of_the_same_shape_receives_into_it() -> None:
    manifest, _ = _manifest(*_adam())
    model, opt = _adam()
    why, targets = receiving_layout(manifest, model.state_dict(), [g["params"] for g in opt.param_groups], opt.state)
    assert why == ""
    params = [p for g in opt.param_groups for p in g["params"]]
    for e, t in zip(manifest.entries, targets, strict=True):
        if e.part is Part.OPTIM:
            assert t is opt.state[params[e.param]][e.name]


def test_the_received_optimizer_state_loads_as_the_sources_with_its_param_groups() -> None:
    src_model, src_opt = _adam()
    src_opt.param_groups[0]["lr"] = 0.003  # a scheduler moved it: the receiver must take it too
    manifest, sent = _manifest(src_model, src_opt)
    model, opt = _adam(stepped=False)
    _, targets = receiving_layout(manifest, model.state_dict(), [g["params"] for g in opt.param_groups], opt.state)
    for t, s in zip(targets, sent, strict=True):
        t.copy_(s)
    opt.load_state_dict(manifest.optimizer_state(targets))
    assert opt.param_groups[0]["lr"] == 0.003
    want, got = src_opt.state_dict()["state"], opt.state_dict()["state"]
    assert want.keys() == got.keys()
    for i in want:
        assert all(torch.equal(want[i][k], got[i][k]) for k in want[i])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda: torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5)), "0.weight"),
        (lambda: torch.nn.Sequential(torch.nn.Linear(4, 4)), "this rank lacks"),
    ],
    ids=["a-parameter-of-another-shape", "a-missing-layer"],
)
def test_a_receiver_whose_model_differs_is_refused_with_the_difference_named(change: object, named: str) -> None:
    manifest, _ = _manifest(*_adam())
    model = change()  # type: ignore[operator]
    opt = torch.optim.Adam(model.parameters())
    why, targets = receiving_layout(manifest, model.state_dict(), [g["params"] for g in opt.param_groups], opt.state)
    assert named in why and targets == []


def test_a_receiver_whose_optimizer_groups_differ_is_refused() -> None:
    manifest, _ = _manifest(*_adam())
    model, _ = _adam(stepped=False)
    params = list(model.parameters())
    opt = torch.optim.Adam([{"params": params[:2]}, {"params": params[2:]}])
    why, _ = receiving_layout(manifest, model.state_dict(), [g["params"] for g in opt.param_groups], opt.state)
    assert "param groups" in why


class _Tied(torch.nn.Module):
    """An embedding shared with the output layer (a language model's tied weights) when `tied`."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        if tied:
            self.head.weight = self.embed.weight


def test_a_tied_tensor_is_one_entrys_bytes_and_its_other_name_carries_none() -> None:
    model = _Tied(tied=True)
    opt = torch.optim.Adam(model.parameters())
    manifest, sent = _manifest(model, opt)
    by_name = {e.name: (i, e) for i, e in enumerate(manifest.entries)}
    (first, embed), (_, head) = by_name["embed.weight"], by_name["head.weight"]
    assert embed.same_as == -1 and head.same_as == first and not head.carried
    carried = {p.index for u in plan_units(manifest.entries, 1 << 20) for p in u}
    assert carried == {first}  # 512 bytes once, not twice
    assert len(sent) == len(manifest.entries)


def test_a_receiver_whose_model_does_not_tie_them_still_gets_the_tied_tensors_values() -> None:
    manifest, sent = _manifest(_Tied(tied=True), torch.optim.Adam(_Tied(tied=True).parameters()))
    untied = _Tied(tied=False)
    opt = torch.optim.Adam([untied.embed.weight])  # as many parameters as the source's optimizer has
    why, targets = receiving_layout(manifest, untied.state_dict(), [g["params"] for g in opt.param_groups], opt.state)
    assert why == ""
    for e, t, s in zip(manifest.entries, targets, sent, strict=True):
        if e.carried:
            t.copy_(s)
    assert not torch.equal(untied.head.weight, untied.embed.weight)
    fill_tied(manifest.entries, targets)
    assert torch.equal(untied.head.weight, untied.embed.weight)
    assert untied.head.weight.data_ptr() != untied.embed.weight.data_ptr()
