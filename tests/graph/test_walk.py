"""gs.trace against ground truth: a plain walk over next_functions, torch's own tensors."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import SAMPLES, graph_counts, reference_walk
from graphs import ALL, FakeModelOutput, Out, Pair, chain, custom_saved_none, views

import gradscope as gs


def _roots(outputs):
    from gradscope.graph.nest import iter_tensors

    return [t for _, t in iter_tensors(outputs) if t.requires_grad]


@pytest.mark.parametrize("name", sorted(ALL))
def test_names_and_edges_match_reference_walk(name):
    outputs, params = ALL[name]()
    g = gs.trace(outputs, params=params)
    assert graph_counts(g) == reference_walk(_roots(outputs))


@pytest.mark.parametrize("sample", ["mlp", "cnn", "transformer", "custom_function"])
def test_samples_match_reference_walk(sample):
    mf = gs.load_model_file(SAMPLES / f"{sample}.py")
    fwd = mf.forward()
    g = gs.trace(fwd.outputs, model=fwd.model)
    assert graph_counts(g) == reference_walk(_roots(fwd.outputs))
    leaves = {n.name for n in g.nodes if n.kind == "leaf"}
    assert leaves == {n for n, p in fwd.model.named_parameters() if p.requires_grad}


def test_ids_are_stable_and_in_walk_order():
    a = gs.trace(*ALL["lstm_cell"]()).to_json()
    b = gs.trace(*ALL["lstm_cell"]()).to_json()
    assert a == b
    g = gs.trace(*ALL["mlp"]())
    assert [n.id for n in g.nodes] == [f"n{i}" for i in range(len(g.nodes))]
    assert g.roots == ["n0"] and g.nodes[0].kind == "output"


def test_leaves_are_named_and_shaped_from_params():
    outputs, params = ALL["mlp"]()
    g = gs.trace(outputs, params=params)
    for n in g.nodes:
        if n.kind == "leaf":
            assert list(params[n.name].shape) == n.tensor.shape
            assert n.tensor.dtype == "float32" and n.tensor.device == "cpu"
    # every leaf hangs off an AccumulateGrad
    acc = {n.id for n in g.nodes if n.kind == "accumulate"}
    leaf_edges = [e for e in g.edges if g.node(e.dst).kind == "leaf"]
    assert {e.src for e in leaf_edges} == acc


def test_params_accepts_a_module_and_rejects_junk():
    lin = torch.nn.Linear(2, 2)
    g = gs.trace(lin(torch.randn(1, 2)), params=lin)
    assert {n.name for n in g.nodes if n.kind == "leaf"} == {"weight", "bias"}
    g2 = gs.trace(lin(torch.randn(1, 2)), model=lin)
    assert {n.name for n in g2.nodes if n.kind == "leaf"} == {"weight", "bias"}
    with pytest.raises(gs.GradscopeError, match="named_parameters"):
        gs.trace(lin(torch.randn(1, 2)), params=[1, 2])
    with pytest.raises(gs.GradscopeError, match="not a tensor"):
        gs.trace(lin(torch.randn(1, 2)), params={"w": 3})


def test_saved_tensors_match_the_autograd_nodes():
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    h = torch.relu(x @ w)
    out = (h @ w.t()).sum()
    g = gs.trace(out, params={"x": x, "w": w})
    by_name = {}
    for n in g.nodes:
        by_name.setdefault(n.name, []).append(n)
    relu = by_name["ReluBackward0"][0]
    (res,) = relu.saved
    assert res.name == "result" and res.shape == [3, 5] and res.nbytes == 60
    assert res.dtype == "float32" and not res.freed
    # the relu result is also the next matmul's saved `self`: one storage id for both
    mm_nodes = by_name["MmBackward0"]
    shared = [s for n in mm_nodes for s in n.saved if s.storage == res.storage]
    assert shared, "the saved relu result must share its storage id with the next op's input"
    # ground truth for the storage ids: same untyped storage <=> same id
    fn = out.grad_fn.next_functions[0][0]  # MmBackward0 of h @ w.t()
    assert fn._saved_self.untyped_storage().data_ptr() == relu_result_ptr(out)


def relu_result_ptr(out):
    fn = out.grad_fn.next_functions[0][0]
    relu = fn.next_functions[0][0]
    return relu._saved_result.untyped_storage().data_ptr()


def test_saved_result_shares_id_with_next_ops_mat1():
    lin1, lin2 = torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)
    out = lin2(torch.relu(lin1(torch.randn(3, 4))))
    g = gs.trace(out)
    relu = next(n for n in g.nodes if n.name == "ReluBackward0")
    addmm = g.nodes[1]
    assert addmm.name == "AddmmBackward0"
    mat1 = next(s for s in addmm.saved if s.name == "mat1")
    assert mat1.storage == relu.saved[0].storage
    # distinct storages get distinct ids
    storages = {s.storage for n in g.nodes for s in n.saved}
    ptrs = set()
    for fn in (out.grad_fn, out.grad_fn.next_functions[1][0].next_functions[0][0]):
        ptrs.add(fn._saved_mat1.untyped_storage().data_ptr())
    assert len(storages) >= len(ptrs)


def test_freed_graph_never_raises_and_marks_freed():
    outputs, params = ALL["mlp"]()
    before = gs.trace(outputs, params=params)
    outputs.backward()
    after = gs.trace(outputs, params=params)
    assert graph_counts(before) == graph_counts(after)
    saved_before = [(n.id, s.name) for n in before.nodes for s in n.saved]
    saved_after = [(n.id, s.name) for n in after.nodes for s in n.saved]
    assert saved_before == saved_after
    assert all(s.freed and s.nbytes == 0 for n in after.nodes for s in n.saved)
    # shapes survive through the `<name>_sym_sizes` attributes torch keeps
    addmm = next(n for n in after.nodes if n.name == "AddmmBackward0")
    mat1 = next(s for s in addmm.saved if s.name == "mat1")
    assert mat1.shape == [3, 8]
    assert after.saved_bytes() == 0 and before.saved_bytes() > 0


def test_retain_graph_keeps_saved_tensors():
    outputs, params = ALL["mlp"]()
    outputs.backward(retain_graph=True)
    g = gs.trace(outputs, params=params)
    assert not any(s.freed for n in g.nodes for s in n.saved)


def test_custom_function_kind_saved_and_ctx_attrs():
    outputs, params = custom_saved_none()
    g = gs.trace(outputs, params=params)
    node = next(n for n in g.nodes if n.kind == "custom")
    assert node.name == "Scale2Backward"
    # saved None is skipped, indices keep their place
    assert [s.name for s in node.saved] == ["saved_tensors[0]", "saved_tensors[2]"]
    assert node.attrs == {"note": "kept on ctx"}
    outputs.backward()
    g2 = gs.trace(outputs, params=params)
    node2 = next(n for n in g2.nodes if n.kind == "custom")
    assert [s.freed for s in node2.saved] == [True]


def test_inplace_modified_saved_tensor_does_not_raise():
    x = torch.randn(3, requires_grad=True)
    y = x.exp()
    z = y * 2
    s = (y.sin()).sum()
    y.add_(1)  # sin saved the old y: backward through it would fail, tracing must not
    g = gs.trace([s, z], params={"x": x})
    sin = next(n for n in g.nodes if n.name == "SinBackward0")
    assert sin.saved[0].shape == [3] and not sin.saved[0].freed


def test_checkpointed_tensors_are_not_unpacked():
    from torch.utils.checkpoint import checkpoint

    lin = torch.nn.Linear(4, 4)
    calls = []

    def block(x):
        calls.append(1)
        return torch.relu(lin(x)).exp()

    y = checkpoint(block, torch.randn(2, 4, requires_grad=True), use_reentrant=False)
    assert len(calls) == 1
    g = gs.trace(y.sum(), params=lin)
    assert len(calls) == 1, "tracing must not run the checkpointed forward again"
    exp = next(n for n in g.nodes if n.name == "ExpBackward0")
    (res,) = exp.saved
    assert res.nbytes == 0 and not res.freed and "result.packed" in exp.attrs
    y.sum().backward()  # the graph still works after tracing
    assert lin.weight.grad is not None


def test_non_tensor_attrs_are_strings():
    x = torch.randn(2, 3, requires_grad=True)
    g = gs.trace(x.sum(dim=1, keepdim=True), params={"x": x})
    node = g.nodes[1]
    assert node.name == "SumBackward1"
    assert node.attrs["keepdim"] == "True" and node.attrs["self_sym_sizes"] == "(2, 3)"


def test_view_outputs_get_their_base_as_torchviz_draws_it():
    out, params = views()
    g = gs.trace(out, params=params)
    view_edges = [e for e in g.edges if e.kind == "view"]
    assert len(view_edges) == 1  # torch keeps the root base: z._base is y
    base = g.node(view_edges[0].dst)
    assert base.kind == "output" and base.view_base and not base.attrs
    assert base.tensor.shape == list(out._base.shape)
    assert base.tensor.storage == g.node(g.roots[0]).tensor.storage


@pytest.mark.parametrize(
    "make",
    [
        lambda t: {"a": t, "b": None},
        lambda t: [None, (t, 3), "text"],
        lambda t: Out(logits=t, aux=object()),
        lambda t: Pair(first=t, second=t * 2),
        lambda t: FakeModelOutput(logits=t, past=(None,)),
    ],
    ids=["dict", "list", "dataclass", "namedtuple", "modeloutput"],
)
def test_nests_of_outputs(make):
    x = torch.randn(3, requires_grad=True)
    outputs = make(x.sin())
    g = gs.trace(outputs, params={"x": x})
    outs = [g.node(r) for r in g.roots]
    assert all(n.kind == "output" for n in outs)
    assert graph_counts(g) == reference_walk(_roots(outputs))


def test_output_names_follow_the_nest():
    x = torch.randn(3, requires_grad=True)
    g = gs.trace({"loss": x.sum(), "parts": [x.exp()]})
    assert [g.node(r).name for r in g.roots] == ["output['loss']", "output['parts'][0]"]


def test_no_grad_outputs_raise_a_helpful_error():
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        out = lin(torch.randn(1, 2))
    with pytest.raises(gs.NoGradError, match="no_grad"):
        gs.trace(out)
    with pytest.raises(gs.NoGradError, match="no tensor"):
        gs.trace({"a": 1, "b": None})


def test_deep_chain_beyond_the_recursion_limit():
    n = 20_000
    assert n > sys.getrecursionlimit()
    y, x = chain(n)
    g = gs.trace(y, params={"x": x})
    assert sum(1 for node in g.nodes if node.name == "MulBackward0") == n
    assert len(g.edges) == n + 2  # output->mul, n-1 mul->mul, mul->acc, acc->leaf
    text = g.to_dot()
    assert text.count("MulBackward0") == n
    assert gs.Graph.from_json(g.to_json()) == g


def test_saved_false_skips_saved_and_attrs():
    outputs, params = ALL["mlp"]()
    g = gs.trace(outputs, params=params, saved=False)
    assert all(not n.saved and not n.attrs for n in g.nodes)
    assert graph_counts(g) == graph_counts(gs.trace(outputs, params=params))
