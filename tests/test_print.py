"""``print()`` of every gradscope report shows the readable text a terminal would, never a
dataclass dump or ``<rich... object at 0x...>`` (issue 46: the first hour of a user)."""

from __future__ import annotations

import torch

import gradscope as gs


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _readable(obj, *words: str) -> str:
    text = str(obj)
    assert "object at 0x" not in text and "(" + type(obj).__name__ not in text[:80], text[:200]
    for w in words:
        assert w in text, (w, text[:400])
    return text


def test_every_report_prints_as_text():
    model, x = _model(), torch.randn(16, 4)
    _readable(gs.check(lambda t: (t * t).sum(), torch.randn(3, dtype=torch.double,
                                                             requires_grad=True)), "pass")
    _readable(gs.explain(torch.arange(12.0).reshape(3, 4).t()), "stride")
    _readable(gs.trace(model(x).sum(), model=model, saved=True).memory(), "saved")
    _readable(gs.activation_report(model, x), "0")
    _readable(gs.step_memory(model, x), "peak")
    plan = gs.plan_checkpoints(model, x, budget="1GiB")
    _readable(plan)
    with gs.GradMonitor(model) as mon:
        model(x).square().mean().backward()
    _readable(mon.report(), "0.weight")
    doc = gs.doctor(model)
    with doc:
        model(x).square().mean().backward()
    _readable(doc.report())
