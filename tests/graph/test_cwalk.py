"""The compiled walk (gradscope/graph/_cwalk.c) against the pure-Python walker, its reference.

Both must give equal graphs (nodes, edges, saved tensors, attrs, ids) and the same grad_fn -> id
map on every graph; the C code must not leak references or hide errors.
"""

from __future__ import annotations

import gc
import os
import sys

import pytest
import torch
from conftest import SAMPLES
from graphs import ALL, chain

import gradscope as gs
from gradscope.graph import walk as _capture

needs_c = pytest.mark.skipif(
    _capture.CWALK is None, reason="compiled walk off (not built, or GRADSCOPE_PURE_PYTHON=1)"
)


@pytest.fixture
def pure_python(monkeypatch):
    """Run the body with the Python walker."""

    def use(flag: bool) -> None:
        monkeypatch.setattr(_capture, "CWALK", None if flag else _ORIGINAL)

    return use


_ORIGINAL = _capture.CWALK


def _both(use, fn):
    use(False)
    fast = fn()
    use(True)
    slow = fn()
    use(False)
    return fast, slow


def test_compiled_walk_is_built_when_required():
    """CI sets GRADSCOPE_REQUIRE_CWALK=1 (scripts/test.sh): a build that silently fell back to
    the Python walker must fail there, not just run slower."""
    if os.environ.get("GRADSCOPE_REQUIRE_CWALK") == "1":
        assert _capture.CWALK is not None, "gradscope.graph._cwalk did not build or import"
    else:
        pytest.skip("GRADSCOPE_REQUIRE_CWALK is not set")


@needs_c
@pytest.mark.parametrize("saved", [True, False])
@pytest.mark.parametrize("name", sorted(ALL))
def test_same_graph_and_ids_as_python_walker(pure_python, name, saved):
    outputs, params = ALL[name]()

    def run():
        g, ids = _capture.trace_with_ids(outputs, params, saved=saved)
        return g, {id(fn): nid for fn, nid in ids.items()}

    (g_c, ids_c), (g_py, ids_py) = _both(pure_python, run)
    assert g_c == g_py
    assert g_c.to_json() == g_py.to_json()
    assert ids_c == ids_py


@needs_c
@pytest.mark.parametrize(
    "sample", ["mlp", "cnn", "transformer", "custom_function", "checkpointing", "deep_encoder"]
)
def test_samples_same_graph_with_module_scopes(pure_python, sample):
    fwd = gs.load_model_file(SAMPLES / f"{sample}.py").forward()  # records module scopes
    g_c, g_py = _both(pure_python, lambda: gs.trace(fwd.outputs, model=fwd.model))
    assert any(n.module for n in g_c.nodes)
    assert g_c == g_py


@needs_c
def test_freed_graph_and_unnamed_leaves(pure_python):
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    out = (x.double() @ w).sin().sum()
    out.backward()  # frees the saved tensors
    g_c, g_py = _both(pure_python, lambda: gs.trace(out))
    assert g_c == g_py
    leaves = [n for n in g_c.nodes if n.kind == "leaf"]
    assert sorted(n.tensor.dtype for n in leaves) == ["float32", "float64"]
    assert all(n.tensor.name is None and n.name == "" for n in leaves)
    assert any(s.freed for n in g_c.nodes for s in n.saved)


@needs_c
def test_nodes_are_complete_dataclass_instances():
    """Objects built by C have every field set, fresh mutable defaults, and behave as if built
    by __init__ (repr, eq, replace)."""
    import dataclasses

    out, params = ALL["mlp"]()
    g = gs.trace(out, params=params, saved=False)
    for n in g.nodes:
        for f in dataclasses.fields(n):
            getattr(n, f.name)  # AttributeError if a slot were left empty
        rebuilt = gs.Node(**{f.name: getattr(n, f.name) for f in dataclasses.fields(n)})
        assert rebuilt == n and repr(rebuilt) == repr(n)
    op = [n for n in g.nodes if n.kind == "op"]
    op[0].attrs["x"] = "1"
    assert all("x" not in n.attrs for n in op[1:])  # no shared dict
    for e in g.edges:
        assert isinstance(e.dst, str) and e == gs.Edge(e.src, e.dst, e.input_nr)


@needs_c
def test_no_reference_leaks():
    out, params = ALL["lstm_cell"]()
    root = out[0].grad_fn
    gs.trace(out, params=params)  # warm the per-class caches
    gc.collect()
    before_root = sys.getrefcount(root)
    before = len(gc.get_objects())
    for _ in range(20):
        gs.trace(out, params=params)
        gs.trace(out, params=params, saved=False)
    gc.collect()
    assert sys.getrefcount(root) == before_root
    assert len(gc.get_objects()) - before < 50


@needs_c
def test_errors_in_python_callbacks_propagate():
    out, _ = ALL["mlp"]()

    def boom(*args):
        raise ValueError("visit failed")

    w = _capture._Walker({}, False, True)  # reads module paths through a Python method
    w.visit_modules = boom  # the walk is given the walker's methods when it starts
    with pytest.raises(ValueError, match="visit failed"):
        w.walk(out.grad_fn)
    out.backward()
    w = _capture._Walker({}, True, False)
    w.read_saved = boom  # freed tensors go to Python
    with pytest.raises(ValueError, match="visit failed"):
        w.walk(out.grad_fn)
    with pytest.raises(TypeError, match=r"walk\(\) argument 2 must be list"):  # nodes
        w.nodes = ()
        w.walk(out.grad_fn)
    with pytest.raises(TypeError, match="make_edges"):
        _capture.CWALK.make_edges([object()], {})
    with pytest.raises(KeyError, match="never walked"):
        _capture.CWALK.make_edges([(("n0"), out.grad_fn, 0)], {})


@needs_c
def test_rare_saved_cases_match_python(pure_python):
    """Saved lists (cat), tensors packed by a pack hook, freed and sparse tensors take the
    Python fallbacks from inside the compiled walk; results must not differ."""
    x = torch.randn(4, 3, requires_grad=True)
    s = torch.randn(4, 4).to_sparse().requires_grad_()
    cat = torch.cat([x.sin(), x.cos()])  # CatBackward0 keeps sizes; stack-like saved lists
    stacked = torch.stack([x.exp(), x.tanh()]).sum()
    sp = torch.sparse.mm(s, x).sum()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: ("packed", t), lambda p: p[1]):
        packed = (x * x.sigmoid()).sum()
    freed = (x.pow(3)).sum()
    freed.backward()
    outs = (cat.sum(), stacked, sp, packed, freed)
    g_c, g_py = _both(pure_python, lambda: gs.trace(outs, params={"x": x, "s": s}))
    assert g_c == g_py
    saved = [sv for n in g_c.nodes for sv in n.saved]
    assert any(sv.freed for sv in saved)
    assert any(".packed" in k for n in g_c.nodes for k in n.attrs)
    # the sparse operand: no storage id, its bytes are its indices' and values'
    sparse_bytes = s._indices().nbytes + s._values().nbytes
    assert any(sv.storage is None and sv.nbytes == sparse_bytes for sv in saved)


@needs_c
def test_layout_check_rejects_a_changed_dataclass():
    from dataclasses import dataclass, fields

    @dataclass(slots=True)
    class Short:
        id: str

    @dataclass
    class NoSlots:  # TensorInfo's field count, but plain class attributes
        a: int = 0
        b: int = 0
        c: int = 0
        d: int = 0
        e: int = 0

    from gradscope.graph import _cwalk

    def cfg(node_cls, ti_cls):
        layouts = []
        for cls in (node_cls, gs.Edge, ti_cls, gs.SavedTensor):
            layouts += [cls, tuple(f.name for f in fields(cls))]
            if cls is node_cls:
                layouts.append(_capture._node_defaults() if cls is gs.Node else ())
        _cwalk.configure(
            *layouts, _capture._class_entry, _capture._DTYPE_NAMES, _capture._dtype_name,
            torch.Tensor, _capture._storage_key,
        )

    try:
        with pytest.raises(RuntimeError, match="update gradscope/graph/_cwalk.c"):
            cfg(Short, gs.TensorInfo)
        with pytest.raises(RuntimeError, match="not a __slots__ member"):
            cfg(gs.Node, NoSlots)
        # the slots, and a __weakref__ the C code would leave unset
        Weak = dataclass(slots=True, weakref_slot=True)(
            type("Weak", (), {"__annotations__": {k: int for k in "abcde"}})
        )
        with pytest.raises(RuntimeError, match="holds more than its fields' slots"):
            cfg(gs.Node, Weak)
    finally:
        cfg(gs.Node, gs.TensorInfo)  # restore the real layout
    out, params = ALL["mlp"]()
    assert gs.trace(out, params=params).nodes[0].kind == "output"


@needs_c
def test_long_chain_same_as_python(pure_python):
    y, x = chain(3000)
    g_c, g_py = _both(pure_python, lambda: gs.trace(y, params={"x": x}))
    assert g_c == g_py and len(g_c.nodes) == 3003


@needs_c
def test_ids_past_the_shared_ones(pure_python):
    """The first 16,384 node ids and storage ids are strings made once and shared by every
    graph; the ids after them are made per walk: both in walk order, each once, equal in two
    walks and to the Python walker's."""
    x = torch.randn(2, requires_grad=True)
    y = x
    for _ in range(16_500):
        y = y.sin()  # saves its input: one storage per op
    g_c, g_py = _both(pure_python, lambda: gs.trace(y, params={"x": x}))
    assert g_c == g_py
    ids = [n.id for n in g_c.nodes]
    assert ids == [f"n{i}" for i in range(len(ids))] and len(ids) > 16_384
    sids = [sv.storage for n in g_c.nodes for sv in n.saved]
    assert len(set(sids)) == len(sids) > 16_384
    assert sorted(sids, key=lambda s: int(s[1:])) == [f"s{i}" for i in range(1, len(sids) + 1)]
    assert gs.trace(y, params={"x": x}) == g_c
