"""The monitor's fast path (``measure.Layout``, ``_measure_dense``): a step whose watched
parameters all have dense gradients is measured without Python work per parameter beyond
reading ``.grad``; anything else (a missing or sparse gradient) takes the general path. Both
give the figures plain torch gives."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradscope as gs
from gradscope.monitor import measure as M


class Mixed(nn.Module):
    """Parameters of three dtypes, interleaved in model order, and an optional sparse
    embedding between them."""

    def __init__(self, sparse: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4).double()
        self.emb = nn.Embedding(10, 4, sparse=sparse)
        self.c = nn.Linear(4, 4).to(torch.bfloat16)
        self.d = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h = self.a(x) + self.emb(ids)
        h = self.b(h.double()).float()
        h = self.c(h.to(torch.bfloat16)).float()
        return self.d(h)


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per measurement: whether the fast path gave it."""
    seen: list[bool] = []
    real = M._measure_dense

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(M, "_measure_dense", spy)
    return seen


def _truth(model: nn.Module) -> dict[str, float]:
    out = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad.coalesce().values() if p.grad.is_sparse else p.grad
            out[name] = torch.linalg.vector_norm(g.double()).item()
    return out


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_mixed_dtypes_take_the_right_path_and_match_torch(sparse: bool, taken) -> None:
    torch.manual_seed(0)
    model = Mixed(sparse)
    mon = gs.GradMonitor(model, full_every=2)
    x, ids = torch.randn(3, 4), torch.tensor([1, 2, 3])
    for _ in range(3):
        model.zero_grad(set_to_none=False)
        model(x, ids).square().sum().backward()
        truth = _truth(model)
        st = mon.history[-1]
        assert set(st.params) == set(truth)
        for name, norm in truth.items():
            assert st.params[name].norm == pytest.approx(norm, rel=2e-3), name
        if st.full:
            for name, p in model.named_parameters():
                g = p.grad.to_dense() if p.grad.is_sparse else p.grad
                ps = st.params[name]
                assert ps.max_abs == pytest.approx(g.double().abs().max().item(), rel=1e-2)
                assert ps.zero_frac == (g == 0).double().mean().item()
    assert taken == [not sparse] * 3
    mon.remove()


def test_a_parameter_without_a_gradient_takes_the_general_path(taken) -> None:
    torch.manual_seed(0)
    model = Mixed()
    mon = gs.GradMonitor(model)
    x, ids = torch.randn(3, 4), torch.tensor([1, 2, 3])
    model(x, ids).sum().backward()
    model.zero_grad(set_to_none=True)
    model.d(torch.randn(2, 4)).sum().backward()  # only d gets a gradient
    assert sorted(mon.history[-1].params) == ["d.bias", "d.weight"]
    assert mon.history[-1].params["d.weight"].norm == pytest.approx(
        model.d.weight.grad.norm().item(), rel=1e-6)
    assert taken == [True, False]
    mon.remove()


def test_the_gradient_is_measured_as_the_backward_left_it() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = gs.GradMonitor(model, optimizer=opt)
    model(torch.randn(4, 3)).sum().backward()
    model.weight.grad = torch.full_like(model.weight, float("nan"))  # after the backward
    opt.step()
    # measured at the end of the backward: the gradient the backward made, finite
    assert mon.history[-1].params["weight"].nan == 0
    mon.remove()


def test_a_huge_gradient_touched_in_place_after_backward_is_no_inf() -> None:
    """Issue 47: gradients of about 1e20 (finite, but their float32 norm overflows), then
    ``grad.mul_(1.0)`` between backward() and step(): no false ``inf`` alert, and the norm
    is the gradient's float64 norm."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    mon = gs.GradMonitor(model, optimizer=opt)
    (model(torch.ones(2, 4)).sum() * 1e20).backward()
    truth = model.weight.grad.double().norm().item()
    assert torch.isinf(torch.linalg.vector_norm(model.weight.grad))  # float32 overflows
    model.weight.grad.mul_(1.0)  # touched in place: its version moves
    opt.step()
    ps = mon.history[-1].params["weight"]
    assert (ps.nan, ps.inf) == (0, 0)
    assert ps.norm == pytest.approx(truth, rel=1e-6)
    assert not [a for a in mon.alerts if a.kind in ("inf", "nan")]
    assert not mon.incidents
    mon.remove()
