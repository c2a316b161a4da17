"""Right numbers at the edges of float (monitor and backward recorder), parameters replaced or
added while the monitor runs, complex parameters, inference mode, vmap, functional_call."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import gradscope as gs


def _truth(p: torch.Tensor) -> float:
    g = p.grad
    wide = torch.complex128 if g.is_complex() else torch.float64
    return torch.linalg.vector_norm(g.to(wide)).item()


def _set(model: nn.Module, value: float) -> None:
    torch.manual_seed(1)
    for p in model.parameters():
        p.grad = (torch.rand_like(p) + 0.5) * value  # every element non-zero


@pytest.mark.parametrize("value", [1e-25, 1e-21, 1e30, 3e37])
@pytest.mark.parametrize("full_every", [1, 50])
def test_norms_at_the_edges_are_float64_right(value: float, full_every: int) -> None:
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    mon = gs.GradMonitor(model, optimizer=opt, full_every=full_every)
    for _ in range(4):
        _set(model, value)
        opt.step()
    mon.remove()
    st = mon.history[-1]
    for name, p in model.named_parameters():
        ps = st.params[name]
        assert ps.norm == pytest.approx(_truth(p), rel=1e-5, abs=0), name
        assert (ps.nan, ps.inf) == (0, 0)
    grads = [p.grad.double() for p in model.parameters()]
    assert st.total_norm == pytest.approx(nn.utils.get_total_norm(grads).item(), rel=1e-5, abs=0)
    assert math.isfinite(st.total_norm) and st.total_norm > 0
    # tiny but not zero: vanishing, never "dead"; huge but finite: exploding, never NaN/Inf
    kinds = {a.kind for a in mon.alerts}
    assert "dead" not in kinds and not kinds & {"nan", "inf"}
    if value > 1:
        assert "exploding" in kinds
    else:
        assert "vanishing" in kinds


def test_exactly_zero_gradients_are_dead() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with gs.GradMonitor(model, optimizer=opt) as mon:
        for _ in range(3):
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            opt.step()
    assert [(a.kind, a.step) for a in mon.alerts] == [("dead", 2)]


@pytest.mark.parametrize("value", [1e-25, 1e30])
def test_backward_recorder_norms_at_the_edges(value: float) -> None:
    x = torch.full((5,), 1.0, requires_grad=True)
    w = torch.linspace(1.0, 2.0, 5)
    out = (x * w * value).sum()
    with gs.record_backward(out, params={"x": x}) as rec:
        out.backward()
    acc = next(s for s in rec.steps if s.name == "AccumulateGrad")
    stat = acc.grad_outputs[0]
    assert stat.norm == pytest.approx(_truth(x), rel=1e-6, abs=0)
    assert not stat.nan and not stat.inf
    assert rec.first_nonfinite is None
    # and no edge of the graph is drawn as non-finite
    assert all(
        e.grad_norm is None or math.isfinite(e.grad_norm) for e in rec.graph.edges
    )


def test_report_marks_every_parameter_with_a_nonfinite_gradient() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with gs.GradMonitor(model, optimizer=opt) as mon:
        for step in range(4):
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            if step >= 1:
                model[0].weight.grad[0, 0] = math.nan  # the first alert names this one
            if step >= 2:
                model[2].bias.grad[1] = math.nan  # later, while the model is already NaN
                model[1].weight.grad[0, 0] = math.inf
            opt.step()
    from gradscope.monitor.views import _ReportTable

    status = {r[0]: r[-1] for r in _ReportTable(mon.log, 24).rows()}
    assert [a.names for a in mon.alerts if a.kind == "nan"] == [("0.weight",)]
    assert status == {
        "0.weight": "nan", "0.bias": "ok", "1.weight": "inf", "1.bias": "ok",
        "2.weight": "ok", "2.bias": "nan",
    }


# ---------------------------------------------------------------- replaced and added
def test_a_parameter_replaced_after_the_start_is_watched_from_the_next_step() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = gs.GradMonitor(model)
    x = torch.randn(8, 4)
    model(x).sum().backward()  # step 0, the first forward checked
    model.zero_grad()
    model[2].weight = nn.Parameter(torch.randn(2, 4) * 3)
    model.add_module("head", nn.Linear(2, 1))  # a Sequential: it runs last
    with pytest.warns(gs.MonitorWarning, match=r"2\.weight.*head\.weight, head\.bias"):
        model(x).sum().backward()  # step 1 ends: the change is seen at its boundary
    model.zero_grad()
    model(x).sum().backward()  # step 2 (through the new head too): the new tensors measured
    mon.remove()
    st = mon.history[-1]
    named = dict(model.named_parameters())
    assert set(st.params) == set(named)
    for name, p in named.items():
        assert st.params[name].norm == pytest.approx(_truth(p), rel=1e-6, abs=0), name
    grads = [p.grad for p in model.parameters()]
    assert st.total_norm == pytest.approx(nn.utils.get_total_norm(grads).item(), rel=1e-6, abs=0)
    del opt


# ---------------------------------------------------------------- complex, modes, transforms
def test_complex_parameters_are_measured() -> None:
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(4, 3, dtype=torch.complex64))
    model = nn.Module()
    model.w = w
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gs.MonitorWarning)
        with gs.GradMonitor(model, optimizer=opt, full_every=1) as mon:
            for _ in range(2):
                opt.zero_grad()
                (w.abs() ** 2).sum().backward()
                opt.step()
    assert len(mon.history) == 2
    ps = mon.history[0].params["w"]
    grad = 2 * w.detach()  # d|w|^2 / d conj(w), the gradient torch gives (before the step)
    assert ps.max_abs is not None and ps.update_ratio is not None
    assert mon.history[1].params["w"].norm == pytest.approx(_truth(w), rel=1e-5, abs=0)
    assert ps.norm > 0 and grad.abs().max().item() > 0


def test_record_forward_under_inference_mode() -> None:
    model = nn.Linear(3, 2)
    with torch.inference_mode(), gs.record_forward(check_finite=True) as fw:
        out = model(torch.randn(2, 3))
    assert out.shape == (2, 2) and fw.first_nonfinite is None


def test_record_forward_check_finite_around_vmap() -> None:
    x = torch.randn(4, 3)
    with gs.record_forward(check_finite=True) as fw:
        out = torch.func.vmap(lambda r: (r * 2).sin())(x)
    assert torch.allclose(out, (x * 2).sin()) and fw.first_nonfinite is None


def test_activation_check_stays_on_under_vmap() -> None:
    model = nn.Linear(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gs.MonitorWarning)
        with gs.GradMonitor(model, activations=True) as mon:
            torch.func.vmap(model)(torch.randn(5, 3))  # batched tensors: not checked
            model(torch.full((2, 3), math.nan)).sum().backward()
    assert [a.kind for a in mon.alerts][:1] == ["forward_nonfinite"]


def test_first_forward_through_functional_call_is_not_refused() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    ema = {n: p.detach().clone() for n, p in model.named_parameters()}
    with gs.GradMonitor(model) as mon:
        with torch.no_grad():
            torch.func.functional_call(model, ema, (torch.randn(2, 3),))
        model(torch.randn(2, 3)).sum().backward()
    assert len(mon.history) == 1
