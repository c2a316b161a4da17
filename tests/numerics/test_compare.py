"""``gs.compare_runs`` on planted samples whose divergence point is known by construction.

Ground truth comes from plain torch in each test: every intermediate of the planted model is
computed by hand in both set-ups, and the first one whose relative error is far beyond the
dtype's rounding is the one ``.first`` must name (op and marked line); the parameters' real
``.grad`` say which gradients differ and by what ratio. Controls (two identical runs, float32
against float64, eager against ``aot_eager``, bfloat16 autocast of a transformer) are ``.ok``.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import SAMPLES
from torch import nn

import gradscope as gs

NUMERICS = SAMPLES / "numerics"


def _sample(name: str, folder: Path = NUMERICS) -> ModuleType:
    path = folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_numerics_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def _marked(name: str, marker: str) -> str:
    """``file.py:N`` of the line holding ``marker`` in the sample."""
    lines = (NUMERICS / f"{name}.py").read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if marker in line]
    assert len(hits) == 1, hits
    return f"{name}.py:{hits[0]}"


def _record(model: nn.Module, args: tuple[Any, ...], loss: Any) -> gs.NumericsRun:
    with gs.record_numerics(model) as run:
        loss(model(*args)).backward()
    return run


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Plain torch: |b - a| / |a| in float64 (inf where only b is non-finite)."""
    a, b = a.double(), b.double()
    if not torch.isfinite(b).all() and torch.isfinite(a).all():
        return float("inf")
    return ((b - a).norm() / a.norm()).item()


def _first_unexplained(errors: list[float], floor: float) -> int:
    """Ground truth: the first intermediate whose error is over 10x the worst before it and
    over the floor (what the sample plants)."""
    worst = 0.0
    for i, e in enumerate(errors):
        if e > floor and e > 10 * max(worst, floor):
            return i
        worst = max(worst, e)
    raise AssertionError(f"nothing planted: {errors}")


# ------------------------------------------------------------------ planted divergences
def test_a_naive_softmax_overflowing_in_float16_is_named_at_its_exp_line():
    s = _sample("softmax_fp16")
    x, target = s.example_input, s.example_target
    # ground truth: each intermediate in float32 and in float16
    def steps(dtype: torch.dtype) -> list[torch.Tensor]:
        w, b = s.model.proj.weight.detach().to(dtype), s.model.proj.bias.detach().to(dtype)
        logits = torch.addmm(b, x.to(dtype), w.T)
        shifted = logits + 12.0
        e = torch.exp(shifted)
        return [logits, shifted, e, e.sum(-1, keepdim=True), e / e.sum(-1, keepdim=True)]
    errors = [_rel(a, b) for a, b in zip(steps(torch.float32), steps(torch.float16),
                                         strict=True)]
    assert _first_unexplained(errors, 1e-2) == 2  # the exp
    ref = _record(copy.deepcopy(s.model), (x,), lambda p: s.loss_fn(p, target))
    cand = _record(copy.deepcopy(s.model).half(), (x.half(),), lambda p: s.loss_fn(p, target))
    d = gs.compare_runs(ref, cand)
    assert not d.ok
    assert d.first is not None
    assert (d.first.phase, d.first.op) == ("forward", "aten.exp")
    assert d.first.line == _marked("softmax_fp16", "# overflows in float16")
    assert d.first.nonfinite > 0 and d.first.ref_nonfinite == 0
    assert "aten.exp" in d.summary() and "non-finite" in d.summary()
    # the path runs from the inputs to the exp and on
    ops = [p.op or p.name for p in d.path]
    assert ops.index("aten.exp") > ops.index("aten.addmm") and d.path[0].phase == "input"


def test_a_variance_losing_its_precision_in_float16_is_named_at_the_subtraction():
    s = _sample("variance_fp16")
    x = s.example_input

    def steps(dtype: torch.dtype) -> list[torch.Tensor]:
        w, b = s.model.proj.weight.detach().to(dtype), s.model.proj.bias.detach().to(dtype)
        h = torch.addmm(b, x.to(dtype), w.T) + 100.0
        mean = h.mean(-1, keepdim=True)
        sq = h * h
        msq = sq.mean(-1, keepdim=True)
        mm = mean * mean
        return [h, mean, sq, msq, mm, msq - mm]
    errors = [_rel(a, b) for a, b in zip(steps(torch.float32), steps(torch.float16),
                                         strict=True)]
    assert _first_unexplained(errors, 1e-2) == 5  # the subtraction
    ref = _record(copy.deepcopy(s.model), (x,), s.loss_fn)
    cand = _record(copy.deepcopy(s.model).half(), (x.half(),), s.loss_fn)
    d = gs.compare_runs(ref, cand)
    assert d.first is not None
    assert (d.first.phase, d.first.op) == ("forward", "aten.sub")
    assert d.first.line == _marked("variance_fp16", "# cancels in float16")
    assert d.first.error == pytest.approx(errors[5], rel=0.5)  # the sketch's estimate
    assert d.first.amplification > 100
    # with a tolerance above the error, the runs agree
    assert gs.compare_runs(ref, cand, rtol=10 * errors[5] + 10).ok


def test_a_custom_function_with_a_wrong_backward_is_named_at_its_line():
    s = _sample("wrong_backward")
    x = s.example_input
    wrong, right = s.model, s.reference_model
    # ground truth: the parameters' real gradients, and the backward's first intermediate
    grads = {}
    for label, m in (("right", right), ("wrong", wrong)):
        m.zero_grad()
        s.loss_fn(m(x)).backward()
        grads[label] = {n: p.grad.clone() for n, p in m.named_parameters()}
        m.zero_grad()
    differ = {n for n in grads["right"]
              if _rel(grads["right"][n], grads["wrong"][n]) > 1e-4}
    assert differ == {"fc1.weight", "fc1.bias"}
    h = right.fc1(x).detach()
    y = h * torch.sigmoid(h)
    assert _rel(torch.sigmoid(h), torch.sigmoid(y)) > 0.1  # the sigmoid is where it starts

    d = gs.compare_runs(_record(right, (x,), s.loss_fn), _record(wrong, (x,), s.loss_fn))
    assert d.first is not None
    assert (d.first.phase, d.first.op) == ("backward", "aten.sigmoid")
    assert d.first.line == _marked("wrong_backward", "# wrong: the sigmoid of the output")
    assert {p.name for p in d.bad_params} == differ
    for p in d.params:
        truth = grads["wrong"][p.name].norm() / grads["right"][p.name].norm()
        assert p.ratio == pytest.approx(truth.item(), rel=1e-5)


def test_a_doubled_gradient_names_that_parameter_with_ratio_two():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    twin = copy.deepcopy(model)
    twin[2].weight.register_hook(lambda g: g * 2)  # the planted bug
    x = torch.randn(8, 6)
    ref = _record(model, (x,), lambda y: y.square().mean())
    cand = _record(twin, (x,), lambda y: y.square().mean())
    truth = {n: (q.grad.norm() / p.grad.norm()).item()
             for (n, p), q in zip(model.named_parameters(), twin.parameters(), strict=True)}
    d = gs.compare_runs(ref, cand)
    assert [p.name for p in d.bad_params] == [n for n, r in truth.items() if abs(r - 1) > 1e-6]
    assert [p.name for p in d.bad_params] == ["2.weight"]
    assert d.bad_params[0].ratio == pytest.approx(2.0, rel=1e-6)
    assert d.first is not None and (d.first.phase, d.first.name) == ("param", "2.weight")


def test_inputs_that_differ_are_said_as_such_not_blamed_on_an_op():
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(8, 6)
    loss = lambda y: y.square().mean()  # noqa: E731
    d = gs.compare_runs(_record(model, (x,), loss), _record(model, (x * 1.01,), loss))
    assert d.first is not None
    assert (d.first.phase, d.first.name) == ("input", "input 0")
    assert d.first.error == pytest.approx(0.01, rel=0.3)
    assert "The inputs differ" in d.summary()


# ------------------------------------------------------------------ controls
def _encoder() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(4, 8, 32)


def test_two_identical_runs_agree():
    model, x = _encoder()
    loss = lambda y: y.square().mean()  # noqa: E731
    a = _record(model, (x,), loss)
    model.zero_grad()
    d = gs.compare_runs(a, _record(model, (x,), loss))
    assert d.ok and d.first is None and d.compared + d.noise == len(a.ops)
    assert all(p.rel_error == 0 and p.ratio == 1 for p in d.params)
    assert "agree" in d.summary()


@pytest.mark.parametrize("setup", ["float64", "bf16"])
def test_float64_and_bf16_autocast_agree_with_float32(setup):
    model, x = _encoder()
    loss = lambda y: y.float().square().mean()  # noqa: E731
    reference, candidate = copy.deepcopy(model), copy.deepcopy(model)
    ref = _record(reference, (x,), loss)
    if setup == "float64":
        cand = _record(candidate.double(), (x.double(),), loss)
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cand = _record(candidate, (x,), loss)
        assert any(op.stats.dtype == "bfloat16" for op in cand.ops)
    d = gs.compare_runs(ref, cand)
    assert d.ok, d.summary()
    assert d.compared + d.noise > 0.8 * len(ref.ops) and d.compared > 0.5 * len(ref.ops)
    # each gradient's figures are those of the real .grad of the two models
    real = {n: (p.grad, q.grad) for (n, p), q in
            zip(reference.named_parameters(), candidate.parameters(), strict=True)}
    for p in d.params:
        g_ref, g_cand = real[p.name]
        assert p.ratio == pytest.approx((g_cand.norm() / g_ref.norm()).item(), rel=1e-5)
        truth = _rel(g_ref, g_cand)
        assert truth * 0.3 - 1e-12 <= p.rel_error <= truth * 2 + 1e-12, (p.name, truth)


def test_eager_and_aot_eager_agree():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    x = torch.randn(8, 8)
    loss = lambda y: y.square().mean()  # noqa: E731
    ref = _record(copy.deepcopy(model), (x,), loss)
    compiled = copy.deepcopy(model)
    runner = torch.compile(compiled, backend="aot_eager")
    with gs.record_numerics(compiled) as cand:
        loss(runner(x)).backward()
    assert any(op.node == "CompiledFunctionBackward" for op in cand.ops)  # compiled code ran
    d = gs.compare_runs(ref, cand)
    assert d.ok, d.summary()
    assert d.compared >= len([op for op in ref.ops if op.phase == "forward"])


def test_runs_of_different_models_are_refused():
    loss = lambda y: y.square().mean()  # noqa: E731
    a = _record(nn.Linear(4, 2), (torch.randn(3, 4),), loss)
    b = _record(nn.Sequential(nn.Linear(4, 2)), (torch.randn(3, 4),), loss)
    with pytest.raises(gs.SchemaError, match="different models"):
        gs.compare_runs(a, b)
    c = _record(nn.Linear(4, 3), (torch.randn(3, 4),), loss)
    with pytest.raises(gs.SchemaError, match="shape"):
        gs.compare_runs(a, c)


def test_names_from_the_model_are_data_in_the_table():
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("[red]evil\x1b[2J", nn.Linear(4, 3))
    x = torch.randn(5, 4)
    loss = lambda y: y.square().mean()  # noqa: E731
    d = gs.compare_runs(_record(model, (x,), loss), _record(model, (x * 3,), loss))
    text = str(d)  # the rich table's text
    assert "[red]evil" in text and "\x1b" not in text
    assert d.first is not None and d.first.phase == "input"
    assert "path to the first divergence" in text and "input 0" in text
