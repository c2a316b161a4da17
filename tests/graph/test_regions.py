"""gs.trace and gs.record_backward on compiled models: each region drawn as its AOTAutograd
backward graph. Ground truth: the backward graph a recording backend was handed (its ops, their
data dependencies, its inputs and outputs), the tensors the region node really saved, torch's
own ``.grad``."""

from __future__ import annotations

import json
import operator
from pathlib import Path

import pytest
import torch
import torch._dynamo
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

import gradscope as gs
from gradscope._torch import torchcompat
from gradscope.errors import SchemaError
from gradscope.graph import compiled

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.norm(torch.relu(self.fc1(x))))


class Recorder:
    """A backend that keeps the backward graphs AOTAutograd hands its backward compiler."""

    def __init__(self) -> None:
        self.backward: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        def bw(g, _):
            self.backward.append(g)
            return make_boxed_func(g.forward)

        return aot_module_simplified(
            gm, example_inputs, fw_compiler=lambda g, _: make_boxed_func(g.forward),
            bw_compiler=bw, partition_fn=min_cut_rematerialization_partition,
        )


def members(graph: gs.Graph, region: gs.Node) -> list[gs.Node]:
    return [n for n in graph.nodes if n.region == region.id and n.id != region.id]


def regions_of(graph: gs.Graph) -> list[gs.Node]:
    return [n for n in graph.nodes if n.compiled is not None]


def traced_and_truth(model: nn.Module, x: torch.Tensor, **trace_kw):
    rec = Recorder()
    opt = torch.compile(model, backend=rec)
    with gs.scopes(opt):
        out = opt(x)
    loss = out.square().mean()
    graph = gs.trace(loss, model=opt, **trace_kw)
    fn = out.grad_fn
    loss.backward()
    return graph, fn, rec.backward[0]


def fx_structure(gm: torch.fx.GraphModule):
    """From the recorded graph alone: op names in order, the op -> op dependencies (by op
    index, a getitem standing for its op), which ops read a tangent, and the producer of each
    returned gradient."""
    ops = [n for n in gm.graph.nodes
           if n.op == "call_function" and n.target is not operator.getitem]
    index = {n: i for i, n in enumerate(ops)}

    def producer(n):
        if n.op == "call_function" and n.target is operator.getitem:
            return producer(n.args[0])
        return n

    deps, tangent_readers = set(), set()
    for i, n in enumerate(ops):
        for a in n.all_input_nodes:
            p = producer(a)
            if p in index:
                deps.add((index[p], i))
            elif p.op == "placeholder" and p.name.startswith("tangents"):
                tangent_readers.add(i)
    out = next(iter(gm.graph.find_nodes(op="output"))).args[0]
    returned = {slot: index[producer(v)] for slot, v in enumerate(out)
                if isinstance(v, torch.fx.Node) and producer(v) in index}
    return [str(n.target) for n in ops], deps, tangent_readers, returned


def test_region_nodes_and_edges_are_the_backward_graph():
    graph, fn, truth = traced_and_truth(Net(), torch.randn(8, 6))
    names, deps, tangent_readers, returned = fx_structure(truth)
    (region,) = regions_of(graph)
    assert region.name == "CompiledFunctionBackward" and region.kind == "custom"
    inner = members(graph, region)
    assert [n.name for n in inner] == names
    assert region.compiled.ops == len(names) and region.compiled.note is None
    pos = {n.id: i for i, n in enumerate(inner)}
    grad = [e for e in graph.edges if e.kind == "grad"]
    assert {(pos[e.src], pos[e.dst]) for e in grad if e.src in pos and e.dst in pos} == deps
    assert {pos[e.dst] for e in grad if e.src == region.id and e.dst in pos} == tangent_readers
    # each gradient the graph returns goes to the node autograd holds for that input
    targets = {k: nxt for k, (nxt, _) in enumerate(fn.next_functions)}
    leaving = {e.input_nr: pos[e.src] for e in grad if e.src in pos and e.dst not in pos}
    assert leaving == returned
    acc_names = {k: type(t).__name__ for k, t in targets.items() if t is not None}
    assert set(leaving) == set(acc_names)  # every input with a next function gets one
    # nothing is left without a way in: ops that only read saved activations hang off the
    # region node by a dotted "saved" edge
    fed = {e.dst for e in graph.edges}
    assert all(n.id in fed for n in inner)
    assert all(e.src == region.id for e in graph.edges if e.kind == "saved")


def test_module_paths_classes_and_lines_from_fx_metadata():
    graph, _, _ = traced_and_truth(Net(), torch.randn(8, 6))
    (region,) = regions_of(graph)
    assert region.module == "<compiled>"
    by_name = {}
    for n in members(graph, region):
        by_name.setdefault(n.name, set()).add(n.module)
    assert by_name["aten.native_layer_norm_backward.default"] == {"<compiled>.norm"}
    assert by_name["aten.threshold_backward.default"] == {"<compiled>"}  # torch.relu in Net
    assert by_name["aten.mm.default"] == {"<compiled>.fc1", "<compiled>.fc2"}
    ln = next(n for n in members(graph, region) if n.module == "<compiled>.norm")
    assert ln.module_classes == ("Net", "torch.compile region", "LayerNorm")
    assert ln.created_at.endswith("return self.fc2(self.norm(torch.relu(self.fc1(x))))")
    assert ln.created_at.split(":")[0].endswith("test_regions.py")
    # leaves keep their own modules (outside the region)
    acc = {graph.node(e.dst).name for e in graph.edges if e.src == region.id} | {
        n.module for n in graph.nodes if n.kind == "accumulate"}
    assert {"fc1", "norm", "fc2"} <= acc


def test_saved_activations_are_what_the_region_node_holds():
    model = Net()
    opt = torch.compile(model, backend="aot_eager")
    out = opt(torch.randn(8, 6))
    fn = out.grad_fn
    held = [r.data for r in fn._raw_saved_tensors] + list(fn._tensors_no_vc_check)
    graph = gs.trace(out, model=opt)
    (region,) = regions_of(graph)
    saved = [s for n in members(graph, region) for s in n.saved] + region.saved
    region_graph = compiled.read_region(fn)
    assert sorted(s.name for s in saved) == sorted(s.name for s in region_graph.saved)
    by_name = {s.name: s for s in saved}
    for slot, t in zip(region_graph.saved, held):
        s = by_name[slot.name]
        assert (s.shape, s.dtype, s.nbytes, s.freed) == (list(t.shape), "float32", t.nbytes, False)
    # a saved parameter shares its leaf's storage: counted once, as a parameter
    leaf_storages = {n.tensor.storage for n in graph.nodes if n.kind == "leaf"}
    assert any(s.storage in leaf_storages for s in saved)
    assert graph.saved_bytes() == sum(
        {s.storage: s.nbytes for s in saved}.values()
    )
    # after backward they are freed; names and shapes stay
    out.sum().backward()
    after = gs.trace(out, model=opt)
    freed = [s for n in after.nodes for s in n.saved]
    assert freed and all(s.freed and s.nbytes == 0 and s.shape for s in freed)


def test_a_region_collapses_like_a_module():
    graph, _, _ = traced_and_truth(Net(), torch.randn(8, 6))
    (region,) = regions_of(graph)
    whole = graph.collapse(0)
    boxes = {n.module: n for n in whole.nodes if n.kind == "module"}
    one = graph.collapse(1)
    box = next(n for n in one.nodes if n.kind == "module" and n.module == "<compiled>")
    assert box.box.cls == "torch.compile region"
    assert box.box.nodes == len(members(graph, region)) + 1
    two = graph.collapse(2)
    assert {n.module for n in two.nodes if n.kind == "module"} >= {
        "<compiled>.fc1", "<compiled>.norm", "<compiled>.fc2"}
    assert boxes  # depth 0: the whole model one box


def test_several_regions_graph_break_and_per_block_compile():
    class Broken(Net):
        def forward(self, x):
            h = torch.relu(self.fc1(x))
            torch._dynamo.graph_break()
            return self.fc2(self.norm(h))

    opt = torch.compile(Broken(), backend="aot_eager")
    with gs.scopes(opt):
        out = opt(torch.randn(4, 6))
    graph = gs.trace(out, model=opt)
    assert [r.module for r in regions_of(graph)] == ["<compiled>", "<compiled>#1"]
    assert {n.module for n in graph.nodes if n.region} >= {
        "<compiled>", "<compiled>.fc2", "<compiled>#1.fc1"}

    counters.clear()

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)
            self.act = nn.GELU()

        def forward(self, x):
            return self.act(self.fc(x))

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(6, 16)
            # compiled one by one: both blocks run the same compiled graph
            self.blocks = nn.ModuleList(
                torch.compile(Block(), backend="aot_eager") for _ in range(2))
            self.head = nn.Linear(16, 2)

        def forward(self, x):
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    model = Stack()
    with gs.scopes(model):
        out = model(torch.randn(4, 6))
    graph = gs.trace(out, model=model)
    assert [r.module for r in regions_of(graph)] == ["blocks.1.<compiled>",
                                                     "blocks.0.<compiled>"]
    inner = {n.module for n in graph.nodes if n.region and n.kind == "op"}
    assert inner == {"blocks.0.<compiled>.fc", "blocks.0.<compiled>.act",
                     "blocks.1.<compiled>.fc", "blocks.1.<compiled>.act"}
    eager = {n.name for n in graph.nodes if n.kind == "op" and not n.region}
    assert "AddmmBackward0" in eager  # embed and head stay eager nodes
    depth1 = {n.module for n in graph.collapse(1).nodes if n.kind == "module"}
    assert depth1 == {"embed", "blocks.0", "blocks.1", "head"}
    assert sum(counters["graph_break"].values()) == 0


def test_json_round_trip_and_older_versions():
    graph, _, _ = traced_and_truth(Net(), torch.randn(8, 6))
    text = graph.to_json()
    assert json.loads(text)["gradscope"] == 4 and json.loads(text)["kind"] == "graph"
    again = gs.Graph.from_json(text)
    assert again == graph
    assert [n.compiled for n in again.nodes if n.compiled] == [r.compiled for r in
                                                              regions_of(graph)]
    assert any(e.kind == "saved" for e in again.edges)
    old = gs.Graph.from_json((GOLDEN / "v2" / "mlp.json").read_text(encoding="utf-8"))
    assert old.nodes and all(n.region is None and n.compiled is None for n in old.nodes)
    assert gs.Graph.from_json(old.to_json()) == old
    d = json.loads(text)
    d["nodes"][0]["region"] = "n999"
    with pytest.raises(SchemaError, match=r"nodes\[0\]\.region: \"n999\" names no node"):
        gs.Graph.from_json(json.dumps(d))
    d = json.loads(text)
    first = next(i for i, n in enumerate(d["nodes"]) if "compiled" in n)
    d["nodes"][first]["compiled"]["ops"] = "21"
    with pytest.raises(SchemaError, match=rf"nodes\[{first}\]\.compiled\.ops"):
        gs.Graph.from_json(json.dumps(d))


def test_regions_false_and_opaque_regions_keep_the_node_as_autograd_has_it(monkeypatch):
    opt = torch.compile(Net(), backend="aot_eager")
    out = opt(torch.randn(4, 6))
    plain = gs.trace(out, model=opt, regions=False)
    assert [n.name for n in plain.nodes].count("CompiledFunctionBackward") == 1
    assert not any(n.region or n.compiled for n in plain.nodes)
    # a torch whose AOTAutograd lacks what gradscope reads (the probe is by feature, not version)
    monkeypatch.setattr(torchcompat, "_OUTPUT_KINDS", ("non_alias", "kind_of_a_future_torch"))
    monkeypatch.setattr(torchcompat, "_SUPPORT", [])
    compiled._REGIONS.clear()
    opaque = gs.trace(out, model=opt)
    (region,) = regions_of(opaque)
    assert region.compiled.ops == 0 and "kind_of_a_future_torch" in region.compiled.note
    for n in opaque.nodes:
        n.compiled = None
    assert opaque == plain  # otherwise the very graph torchviz draws
    assert "CompiledFunctionBackward" in gs.make_dot(out).source


class SqrtNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        h = self.fc(x)
        r = torch.where(h > 0, h.sqrt(), torch.zeros_like(h))  # backward NaN here
        return self.head(r)


def test_record_backward_gradients_at_the_boundary_and_the_nan_inside():
    model = SqrtNet()
    opt = torch.compile(model, backend="aot_eager")
    x = torch.randn(16, 6)
    with gs.record_forward(), gs.scopes(opt):
        loss = opt(x).pow(2).mean()
    with gs.record_backward(loss, model=opt) as rec:
        loss.backward()
    graph = rec.graph
    (region,) = regions_of(graph)
    assert "CompiledFunctionBackward" in [s.name for s in rec.steps]
    assert region.order is not None and region.nonfinite == "nan"
    # the gradient each parameter received, measured where it leaves the region
    params = dict(model.named_parameters())
    leaf_of = {e.src: graph.node(e.dst).name for e in graph.edges
               if graph.node(e.dst).kind == "leaf"}
    for e in graph.edges:
        if e.src in {n.id for n in members(graph, region)} and e.dst in leaf_of:
            want = params[leaf_of[e.dst]].grad.norm().item()
            got = e.grad_norm
            assert (got == pytest.approx(want)) or (got != got and want != want)
    # entering: the gradient of the region's output
    entering = [e for e in graph.edges if e.src == region.id and e.kind == "grad"]
    assert entering and all(e.grad_norm is not None for e in entering)
    bad = rec.first_nonfinite
    assert bad.name == "aten.mul.Scalar" and bad.kind == "nan" and bad.slot == "output"
    assert "r = torch.where(h > 0, h.sqrt(), torch.zeros_like(h))" in bad.traceback
    assert bad.traceback.startswith("tests/graph/test_regions.py:") or "test_regions.py:" in (
        bad.traceback)
    op = graph.node(bad.node_id)
    assert op.region == region.id and op.first_nonfinite and not region.first_nonfinite
    assert "aten.mul.Scalar" in rec.summary()


def test_record_backward_finite_region_names_nothing_and_keeps_nothing():
    model = Net()
    opt = torch.compile(model, backend="aot_eager")
    loss = opt(torch.randn(4, 6)).sum()
    with gs.record_backward(loss, model=opt) as rec:
        loss.backward()
    assert rec.first_nonfinite is None
    (region,) = regions_of(rec.graph)
    assert region.nonfinite is None and region.order is not None
    assert sum(counters["graph_break"].values()) == 0
