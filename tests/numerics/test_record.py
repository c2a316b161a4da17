"""``gs.record_numerics``: what it keeps of each op is what plain torch computes for the same
intermediate, the sketch estimates relative errors, the step is unchanged, and a saved run
reads back equal (strict JSON: NaN as a string)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn

import gradscope as gs
from gradscope.numerics.compare import rel_error
from gradscope.numerics.records import Stats
from gradscope.numerics.sketch import PERIOD, SEED, K, Projector


def _stats(t: torch.Tensor, projector: Projector | None = None) -> Stats:
    row = (projector or Projector()).stats(t).tolist()
    return Stats(str(t.dtype), tuple(t.shape), row[K], row[K + 1], int(row[K + 2]),
                 tuple(row[:K]))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


@pytest.mark.parametrize("n", [7, 32, 1000, 70_001])
@pytest.mark.parametrize("rel", [1e-6, 1e-3, 0.3])
def test_the_sketch_estimates_the_relative_error(n, rel):
    g = torch.Generator().manual_seed(n)
    a = torch.randn(n, generator=g, dtype=torch.float64)
    noise = torch.randn(n, generator=g, dtype=torch.float64)
    b = a + noise * (rel * a.norm() / noise.norm())
    truth = ((a - b).norm() / a.norm()).item()
    est = rel_error(_stats(a), _stats(b))
    assert truth * 0.5 < est < truth * 1.6, (truth, est)


def test_the_sketch_is_linear_fixed_and_independent_of_the_size():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5000, generator=g), torch.randn(5000, generator=g)
    p = Projector()
    sa, sb, sab = (torch.tensor(_stats(t, p).sketch, dtype=torch.float64) for t in (a, b, a + b))
    assert torch.allclose(sa + sb, sab, atol=1e-4)
    # a fresh projector (another process) gives the same numbers; a large tensor seen first
    # does not change the signs of a small one
    fresh = Projector()
    fresh.stats(torch.zeros(300_000))
    assert _stats(a, fresh).sketch == _stats(a, Projector()).sketch
    # by hand: element i goes to bucket i mod K with its sign
    signs = torch.where(Projector().signs(5000, "cpu"), 1.0, -1.0).double()
    by_hand = torch.zeros(K, dtype=torch.float64)
    for i in range(5000):
        by_hand[i % K] += signs[i] * a[i].double()
    assert torch.allclose(by_hand, sa, atol=1e-9)
    # a tensor longer than the signs' period: element i has the sign and bucket of i mod PERIOD
    n = PERIOD + 12_345
    long = torch.randn(n, generator=g, dtype=torch.float64)
    j = torch.arange(n) % PERIOD
    signed = torch.where(Projector().signs(PERIOD, "cpu")[j], long, -long)
    by_hand = torch.zeros(K, dtype=torch.float64).index_add_(0, j % K, signed)
    got = torch.tensor(_stats(long).sketch, dtype=torch.float64)
    assert torch.allclose(by_hand, got, rtol=1e-9, atol=1e-9)
    # norm, max-abs, non-finite count
    st = _stats(torch.tensor([3.0, -4.0, float("inf"), float("nan")]))
    assert st.nonfinite == 2 and math.isnan(st.maxabs)
    st = _stats(torch.tensor([3.0, -4.0]))
    assert (st.norm, st.maxabs, st.nonfinite) == (5.0, 4.0, 0)


def test_each_op_record_is_the_plain_torch_intermediate():
    model = _model()
    x = torch.randn(5, 8)
    with gs.record_numerics(model) as run:
        loss = model(x).square().mean()
        loss.backward()
    # ground truth: the same intermediates computed by hand
    w1, b1, w2, b2 = (p.detach() for p in model.parameters())
    h = x @ w1.T + b1
    t = torch.tanh(h)
    y = t @ w2.T + b2
    forward = [op for op in run.ops if op.phase == "forward"]
    assert [op.op for op in forward] == ["aten.addmm", "aten.tanh", "aten.addmm", "aten.pow",
                                        "aten.mean", "aten.ones_like"]
    for op, truth in zip(forward, [h, t, y, y.square(), y.square().mean()], strict=False):
        assert op.stats.shape == tuple(truth.shape)
        assert op.stats.norm == pytest.approx(truth.norm().item(), rel=1e-6)
        assert op.stats.maxabs == pytest.approx(truth.abs().max().item(), rel=1e-6)
        assert rel_error(_stats(truth), op.stats) < 1e-6
    assert [op.module for op in forward[:3]] == ["0", "1", "2"]
    assert all(op.line and op.line.startswith("test_record.py:") for op in forward)
    backward = [op for op in run.ops if op.phase == "backward"]
    assert backward and all(op.node for op in backward)
    assert {op.module for op in backward if op.op == "aten.mm"} == {"0", "2"}
    # each gradient, named, is the parameter's real .grad
    assert [p.name for p in run.params] == [n for n, _ in model.named_parameters()]
    for rec, (name, p) in zip(run.params, model.named_parameters(), strict=True):
        assert rec.stats is not None
        assert rec.stats.norm == pytest.approx(p.grad.norm().item(), rel=1e-6), name
        assert rel_error(_stats(p.grad), rec.stats) < 1e-7
        assert rec.producer is not None and run.ops[rec.producer].phase == "backward"
    # inputs: the model's argument and the parameters are leaves; the first addmm reads them
    names = [leaf.name for leaf in run.leaves]
    assert "input 0" in names and "0.weight" in names
    first = run.ops[0]
    assert {run.leaves[-s - 1].name for s in first.inputs} == {"0.weight", "0.bias", "input 0"}
    assert run.ops[1].inputs == (0,)


def test_recording_changes_nothing():
    model = _model()
    twin = copy.deepcopy(model)
    x = torch.randn(5, 8)
    model(x).square().mean().backward()
    with gs.record_numerics(twin):
        twin(x).square().mean().backward()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    # nothing stays installed: a forward after the block records nothing anywhere
    with gs.record_numerics() as run:
        pass
    twin(x)
    assert len(run) == 0


def test_a_saved_run_reads_back_equal(tmp_path):
    model = _model()
    x = torch.randn(5, 8)
    x[0, 0] = float("nan")
    with gs.record_numerics(model) as run:
        model(x).square().mean().backward()
    assert any(op.stats.nonfinite for op in run.ops)
    path = run.save(tmp_path / "run.json")
    text = path.read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}"))
    data = json.loads(text)
    assert list(data)[:2] == ["gradscope", "kind"] and data["kind"] == "numerics"
    back = gs.NumericsRun.load(path)
    assert len(back) == len(run)
    for a, b in zip(back.ops, run.ops, strict=True):
        assert (a.op, a.phase, a.module, a.inputs, a.stats.shape, a.stats.nonfinite) == (
            b.op, b.phase, b.module, b.inputs, b.stats.shape, b.stats.nonfinite)
        assert a.stats.sketch == pytest.approx(b.stats.sketch, rel=1e-8, nan_ok=True)
    assert (back.k, back.seed) == (K, SEED)
    with pytest.raises(gs.SchemaError, match="not numerics"):
        gs.NumericsRun.from_json(json.dumps({"gradscope": 2, "kind": "doctor", "findings": []}))


def test_a_record_is_small():
    """A few floats per op: the file of a 2-layer transformer step stays small."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(4, 16, 64)
    with gs.record_numerics(model) as run:
        model(x).square().mean().backward()
    size = len(run.to_json())
    assert size < 1200 * (len(run.ops) + len(run.leaves) + len(run.params))
