"""Nested tensors (``torch.nested``) trace, render and round-trip through JSON in both walkers.

A strided nested tensor has no ``.shape`` (torch raises), a jagged one has a symbolic "nested
int" for its ragged dimension; gradscope records such a dimension as None (``null`` in JSON, ``*``
when drawn) and a dimension all components agree on as its size. Ground truth is built from
the component tensors themselves, and bytes from the buffer that holds them.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from rich.console import Console

import gradscope as gs
from gradscope.graph import walk as _walk

_ORIGINAL = _walk.CWALK
LAYOUTS = {"strided": torch.strided, "jagged": torch.jagged}


def expected_shape(parts: list[torch.Tensor]) -> list[int | None]:
    """The recorded form: the number of components, then each dimension's size where every
    component has the same one, else None (a ragged dimension)."""
    dims = zip(*(p.shape for p in parts), strict=True)
    return [len(parts)] + [d[0] if len(set(d)) == 1 else None for d in dims]


def nested(parts: list[torch.Tensor], layout: str, **kw) -> torch.Tensor:
    with warnings.catch_warnings():  # the strided layout warns that it is a prototype
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor(parts, layout=LAYOUTS[layout], **kw)


def component_bytes(parts: list[torch.Tensor]) -> int:
    return sum(p.numel() * p.element_size() for p in parts)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sizes", [[(2, 3), (4, 3)], [(3, 5), (3, 5), (1, 5)], [(3, 3), (3, 3)]])
def test_nested_leaf_traces_and_round_trips(walker, layout, sizes):
    parts = [torch.randn(*s) for s in sizes]
    nt = nested(parts, layout, requires_grad=True)
    y = (nt * nt).sin()
    g = gs.trace(y, params={"nt": nt})
    want = expected_shape(parts)
    if layout == "jagged" and len(set(sizes)) == 1:
        want[1] = None  # a jagged tensor's dim 1 is ragged by construction, even if all agree
    out, leaf = g.node(g.roots[0]), next(n for n in g.nodes if n.kind == "leaf")
    assert out.tensor.shape == want and leaf.tensor.shape == want and leaf.name == "nt"
    saved = [s for n in g.nodes for s in n.saved if s.dtype == "float32"]
    assert [s.name for s in saved] == ["self", "other", "self"]
    for s in saved:
        assert s.shape == want
        assert all(d is None or type(d) is int for d in s.shape)  # no SymInt in the model
        assert s.nbytes == component_bytes(parts) == s.storage_nbytes
    # the product's two operands are the leaf itself: one storage, the leaf's
    mul = next(n for n in g.nodes if n.name == "MulBackward0")
    assert {s.storage for s in mul.saved} == {leaf.tensor.storage}
    assert g.memory().leaf_bytes == component_bytes(parts)
    assert g.memory().activation_bytes == component_bytes(parts)  # sin keeps nt * nt
    text = g.to_json()
    assert gs.Graph.from_json(text) == g
    if None in want:
        assert "null" in text
        drawn = "(" + ", ".join("*" if d is None else str(d) for d in want) + ")"
        assert drawn in g.to_dot()
        console = Console(width=200, record=True, color_system=None)
        console.print(g.to_tree())
        assert drawn in console.export_text()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nested_from_leaves_of_plain_tensors(walker, layout):
    a = torch.randn(2, 3, requires_grad=True)
    b = torch.randn(4, 3, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        nt = torch.nested.as_nested_tensor([a, b], layout=LAYOUTS[layout])
    y = nt.sin() * 2
    g = gs.trace(y, params={"a": a, "b": b})
    leaves = {n.name: n.tensor.shape for n in g.nodes if n.kind == "leaf"}
    assert leaves == {"a": [2, 3], "b": [4, 3]}
    assert g.node(g.roots[0]).tensor.shape == [2, None, 3]
    sin = next(n for n in g.nodes if n.name == "SinBackward0")
    assert sin.saved[0].nbytes == component_bytes([a, b])
    assert gs.Graph.from_json(g.to_json()) == g


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nested_graph_freed_by_backward(walker, layout):
    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    nt = nested(parts, layout, requires_grad=True)
    y = (nt * 3).sin()
    before = gs.trace(y)
    y.backward(torch.ones_like(y))
    after = gs.trace(y)
    assert nt.grad is not None
    sin = next(n for n in after.nodes if n.name == "SinBackward0")
    assert [(s.name, s.freed) for s in sin.saved] == [("self", True)]
    assert after.memory().total == 0 < before.memory().total
    assert gs.Graph.from_json(after.to_json()) == after


def test_both_walkers_give_the_same_nested_graph(monkeypatch):
    if _ORIGINAL is None:
        pytest.skip("compiled walk off")
    graphs = []
    for cwalk in (_ORIGINAL, None):
        monkeypatch.setattr(_walk, "CWALK", cwalk)
        torch.manual_seed(0)
        s = nested([torch.randn(2, 3), torch.randn(4, 3)], "strided", requires_grad=True)
        j = nested([torch.randn(1, 3), torch.randn(5, 3)], "jagged", requires_grad=True)
        graphs.append(gs.trace([(s * s).sin(), j.cos() * j]))
    assert graphs[0] == graphs[1] and graphs[0].to_json() == graphs[1].to_json()
