"""The terminal tree of a graph annotated by gs.record_backward, and of collapsed module boxes."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
import torch
from conftest import SAMPLES
from rich.console import Console

import gradscope as gs
from gradscope.backward import recorder as _backward


def tree_text(graph: gs.Graph) -> str:
    console = Console(color_system=None, width=200, file=io.StringIO(), legacy_windows=False)
    console.print(gs.render_tree(graph))
    return console.file.getvalue()


def recorded(name: str, **kw) -> gs.BackwardTrace:
    mf = gs.load_model_file(SAMPLES / name)
    with gs.record_forward():
        fwd = mf.forward()
        loss = mf.loss(fwd.outputs)
    with gs.record_backward(loss, model=fwd.model, **kw) as rec:
        loss.backward()
    return rec


def strip_annotations(graph: gs.Graph) -> gs.Graph:
    """The same graph with everything record_backward added taken away."""
    plain = gs.Graph.from_json(graph.to_json())
    for n in plain.nodes:
        n.order = None
        n.nonfinite, n.first_nonfinite, n.created_at = None, False, None
    for e in plain.edges:
        e.grad_norm = None
    return plain


def test_annotated_tree_shows_order_norms_and_the_first_nan():
    rec = recorded("nan_backward.py")
    text = tree_text(rec.graph)
    bad = rec.first_nonfinite
    # every node that ran shows its engine position, next to its name
    for i, step in enumerate(rec.steps):
        if rec.graph.node(step.node_id).order == i:
            assert re.search(rf"#{i} {step.name}\b", text), step.name
    (line,) = [ln for ln in text.splitlines() if f"{bad.name}  {bad.node_id}" in ln]
    assert "first nan gradient" in line
    assert f"created at {bad.traceback}" in text
    assert bad.traceback.startswith("samples/nan_backward.py:")
    assert "first non-finite gradient: nan from SqrtBackward0" in text
    # the edge into the sqrt carries the norm PyTorch computes for that gradient
    edge = next(e for e in rec.graph.edges if e.dst == bad.node_id)
    assert f"{bad.node_id}  ‖∇‖ {edge.grad_norm:.2e}" in text


def test_finite_tree_has_no_alarm():
    text = tree_text(recorded("mlp.py").graph)
    assert "#0 " in text and "‖∇‖" in text
    assert "non-finite" not in text and "✗" not in text


@pytest.mark.parametrize("name", ["mlp.py", "nan_backward.py", "custom_function.py"])
def test_without_annotations_the_tree_is_the_plain_one(name):
    rec = recorded(name, saved=True)
    plain = tree_text(strip_annotations(rec.graph))
    mf = gs.load_model_file(SAMPLES / name)
    fwd = mf.forward()
    assert plain == tree_text(gs.trace(mf.loss(fwd.outputs), model=fwd.model))


def test_module_boxes_show_class_count_and_bytes():
    graph = gs.Graph(
        nodes=[
            gs.Node("n0", "output", "output", tensor=gs.TensorInfo("output", [], "float32", "cpu")),
            gs.Node("m0", "encoder.layers", "module", module="encoder.layers",
                    box=gs.Box("ModuleList", 12, 3072), order=0),
            gs.Node("m1", "embed", "module", module="embed",
                    box=gs.Box("Embedding", 3, 5120, leaf_bytes=4096, output_bytes=512)),
        ],
        edges=[gs.Edge("n0", "m0", 0, grad_norm=2.5), gs.Edge("m0", "m1", 0)],
        roots=["n0"],
    )
    lines = tree_text(graph).splitlines()
    assert lines[-2:] == [
        "#0 encoder.layers (ModuleList) · 12 nodes  saved 3.0 KiB activations  m0  ‖∇‖ 2.50e+00",
        "embed (Embedding) · 3 nodes  saved 512 B activations + 4.0 KiB params/inputs + 512 B "
        "outputs  m1",
    ]


def test_deferred_statistics_match_immediate_ones(monkeypatch):
    """Accelerator gradients are measured on the device and read once at the end: the same
    figures as the immediate CPU path (exercised here on the CPU)."""
    now = recorded("nan_backward.py").steps
    monkeypatch.setattr(_backward, "_stat_now", _backward._stat_later)
    later = recorded("nan_backward.py").steps
    assert [s.name for s in now] == [s.name for s in later]
    for a, b in zip(now, later):
        for x, y in zip(a.grad_outputs + a.grad_inputs, b.grad_outputs + b.grad_inputs):
            assert (x is None) == (y is None)
            if x is not None:
                dx, dy = dataclasses.asdict(x), dataclasses.asdict(y)
                for key in ("norm", "max_abs"):
                    assert dx.pop(key) == pytest.approx(dy.pop(key), rel=1e-6, nan_ok=True)
                assert dx == dy
    assert torch.is_tensor(_backward._stat_later(torch.ones(2))[1])


def test_a_nan_the_forward_made_where_the_backward_first_sees_it_is_said_as_one_node():
    """nan_backward: h.sqrt() made the NaN in the forward (masked by where) and its backward is
    the first non-finite gradient, the same node: not "downstream of it"."""
    run = gs.load_model_file(str(SAMPLES / "nan_backward.py")).backward()
    graph = run.trace.graph
    text = " ".join(tree_text(graph).split())
    assert "the forward already produced nan at SqrtBackward0" in text
    assert "first non-finite gradient, at that node: nan from SqrtBackward0" in text
    assert "downstream of it" not in text
