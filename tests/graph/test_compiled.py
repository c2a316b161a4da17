"""gradscope/graph/compiled.py (reading AOTAutograd's backward graphs) and dynamo.py (staying
invisible to Dynamo). Ground truth: the graphs AOTAutograd hands to a backend's backward
compiler (a custom backend records them), the tensors the backward node really saved, Dynamo's
own counters."""

from __future__ import annotations

import functools
import operator
import warnings
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch._functorch.config
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

from gradscope._torch import dynamo, torchcompat
from gradscope.graph import compiled

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.norm(torch.relu(self.fc1(x)))  # the line of relu, norm and fc1
        return self.fc2(h).tanh(), h.sum()


class Recorder:
    """A backend built on ``aot_module_simplified`` whose backward compiler keeps every backward
    graph it is given: the graphs AOTAutograd produced, seen from outside gradscope. It uses
    the partitioner ``aot_eager`` uses, so its graphs are the ones aot_eager runs."""

    def __init__(self) -> None:
        self.backward: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        def fw(g, _):
            return make_boxed_func(g.forward)

        def bw(g, _):
            self.backward.append(g)
            return make_boxed_func(g.forward)

        return aot_module_simplified(
            gm, example_inputs, fw_compiler=fw, bw_compiler=bw,
            partition_fn=min_cut_rematerialization_partition,
        )


def op_names(gm: torch.fx.GraphModule) -> list[str]:
    """Every op of a backward graph (``getitem`` picks an output of the op before it)."""
    return [str(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and n.target is not operator.getitem]


def test_ops_are_the_backward_graph_aotautograd_compiled():
    model = Net()
    x = torch.randn(3, 4)
    rec = Recorder()
    out, total = torch.compile(model, backend=rec)(x)
    region = compiled.read_region(out.grad_fn)
    (out.sum() + total).backward()
    assert len(rec.backward) == 1
    assert [op.name for op in region.ops] == op_names(rec.backward[0])
    assert not region.opaque and region.note is None
    # aot_eager runs the same graph
    torch._dynamo.reset()
    out2, _ = torch.compile(model, backend="aot_eager")(x)
    assert [op.name for op in compiled.read_region(out2.grad_fn).ops] == op_names(rec.backward[0])


def test_region_boundary_matches_the_node():
    model = Net()
    out, total = torch.compile(model, backend="aot_eager")(torch.randn(3, 4))
    fn = out.grad_fn
    assert total.grad_fn is fn and compiled.is_region(fn)
    region = compiled.read_region(fn)
    # the saved activations are the tensors the node holds, in its order
    held = [r.data for r in fn._raw_saved_tensors] + list(fn._tensors_no_vc_check)
    assert [s.shape for s in region.saved] == [list(t.shape) for t in held]
    assert [s.dtype for s in region.saved] == ["float32"] * len(held)
    assert "relu" in {s.name for s in region.saved}
    # one tangent per differentiable output, in grad_outputs order
    assert region.tangents == [("tangents_1", 0), ("tangents_2", 1)]
    # a gradient for exactly the inputs that have a next function
    assert len(region.outputs) == len(fn.next_functions)
    assert [o is None for o in region.outputs] == [f is None for f, _ in fn.next_functions]
    # native_layer_norm_backward returns three tensors: its getitems fold into slots
    ln = [i for i, op in enumerate(region.ops) if op.name.startswith("aten.native_layer_norm")]
    assert len(ln) == 1
    slots = {r.slot for op in region.ops for r in op.inputs if r.kind == "op" and r.index == ln[0]}
    slots |= {o.slot for o in region.outputs if o is not None and o.index == ln[0]}
    assert slots == {0, 1, 2}
    # inputs refer backwards only (graph order)
    for i, op in enumerate(region.ops):
        assert all(r.index < i for r in op.inputs if r.kind == "op")


def test_module_paths_and_forward_lines_come_from_fx_metadata():
    model = Net()
    out, _ = torch.compile(model, backend="aot_eager")(torch.randn(3, 4))
    region = compiled.read_region(out.grad_fn)
    by_path = {}
    for op in region.ops:
        path = compiled.dynamo_path(op.modules[-1][1]) if op.modules else ""
        by_path.setdefault(path, set()).add(op.name)
    assert "aten.native_layer_norm_backward.default" in by_path["norm"]
    assert "aten.threshold_backward.default" in by_path[""]  # torch.relu in Net.forward
    assert "aten.mm.default" in by_path["fc1"] and "aten.mm.default" in by_path["fc2"]
    # module ids are the live modules
    ids = {key for op in region.ops for key, _, _ in op.modules}
    assert ids == {str(id(model.fc1)), str(id(model.norm)), str(id(model.fc2))}
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if "the line of relu, norm and fc1" in text)
    relu = next(op for op in region.ops if op.name == "aten.threshold_backward.default")
    assert relu.location == (__file__, line, relu.location[2])
    assert relu.location[2].startswith("h = self.norm(torch.relu(self.fc1(x)))")


def test_dynamo_path():
    assert compiled.dynamo_path("L['self'].layers.0.attn") == "layers.0.attn"
    assert compiled.dynamo_path("L['self']") == ""
    assert compiled.dynamo_path("L['fn'].2") == "2"
    assert compiled.dynamo_path("G['model'].fc1") == "model.fc1"
    assert compiled.dynamo_path("L['self'].blocks[3]._modules['mlp']") == "blocks.3.mlp"


def test_plain_name_and_unwrap():
    model = nn.Linear(2, 2)
    opt = torch.compile(model, backend="aot_eager")
    assert dynamo.unwrap(opt) is model and dynamo.unwrap(model) is None
    assert [dynamo.plain_name(n) for n, _ in opt.named_parameters()] == ["weight", "bias"]


def test_unknown_torch_version_is_drawn_opaque_with_a_note(monkeypatch):
    # a torch whose AOTAutograd lacks what gradscope reads (the probe is by feature, not version)
    monkeypatch.setattr(torchcompat, "_OUTPUT_KINDS", ("non_alias", "kind_of_a_future_torch"))
    monkeypatch.setattr(torchcompat, "_SUPPORT", [])
    out, _ = torch.compile(Net(), backend="aot_eager")(torch.randn(3, 4))
    region = compiled.read_region(out.grad_fn)
    assert region.opaque and region.ops == []
    assert "\n" not in region.note and torch.__version__ in region.note
    assert "kind_of_a_future_torch" in region.note
    assert region.outputs == [None] * len(out.grad_fn.next_functions)


def test_unreadable_internals_give_an_opaque_region(monkeypatch):
    def broken(cls, n):
        raise AttributeError("'CompiledFunction' has no attribute 'metadata'")

    monkeypatch.setattr(compiled, "_read", broken)
    out, _ = torch.compile(Net(), backend="aot_eager")(torch.randn(3, 4))
    region = compiled.read_region(out.grad_fn)
    assert region.opaque and "AttributeError" in region.note and "\n" not in region.note


class SqrtNet(nn.Module):
    """The NaN of samples/nan_backward.py: sqrt's backward divides by 2 * NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        h = self.fc(x)
        r = torch.where(h > 0, h.sqrt(), torch.zeros_like(h))  # the NaN's line
        return self.head(r)


def run_and_replay(model, x):
    out = torch.compile(model, backend="aot_eager")(x)
    fn = out.grad_fn
    region = compiled.read_region(fn)
    box = {}

    def pre(grad_outputs):
        box["inputs"] = compiled.capture_inputs(fn)

    def post(grad_inputs, grad_outputs):
        box["grads"] = list(grad_outputs)

    fn.register_prehook(pre)
    fn.register_hook(post)
    out.pow(2).mean().backward()
    return region, compiled.first_nonfinite_op(fn._forward_cls, box["inputs"], box["grads"])


def test_first_nonfinite_op_names_the_aten_op_and_its_line():
    model = SqrtNet()
    region, found = run_and_replay(model, torch.randn(16, 6))
    assert model.fc.weight.grad.isnan().any()  # the NaN is real
    index, kind = found
    op = region.ops[index]
    assert kind == "nan"
    assert op.name == "aten.mul.Scalar"  # 2 * sqrt(h): NaN where h < 0
    assert "the NaN's line" in op.location[2]


def test_first_nonfinite_op_is_none_when_the_gradient_is_finite():
    class Masked(SqrtNet):
        def forward(self, x):  # sqrt(0) has an infinite derivative, masked by where's backward
            h = self.fc(x)
            return self.head(torch.where(h > 0, h, torch.zeros_like(h)).sqrt())

    model = Masked()
    _, found = run_and_replay(model, torch.randn(16, 6))
    assert torch.isfinite(model.fc.weight.grad).all()
    assert found is None


# ---------------------------------------------------------------------- invisible to Dynamo
class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def breaks_and_graphs() -> tuple[int, int]:
    return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("make", [Plain, lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU())],
                         ids=["user-module", "sequential"])
@pytest.mark.parametrize("warm", [False, True], ids=["compiled-inside", "compiled-before"])
def test_module_hooks_add_no_graph_break_recompile_or_warning(make, warm):
    model = make()
    opt = torch.compile(model, backend="aot_eager")
    x = torch.randn(3, 4)
    if warm:
        opt(x)
    seen = []
    hooks = dynamo.ModuleHooks(lambda m, a: seen.append(("pre", type(m).__name__)),
                                 lambda m, a, o: seen.append(("post", type(m).__name__)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning (Dynamo's, OptimizedModule's) fails
        hooks.install()
        try:
            opt(x)
            opt(x)
        finally:
            hooks.remove()
            hooks.remove()  # idempotent
        opt(x)  # after removal: same graph, no recompile
    assert breaks_and_graphs() == (0, 1)
    assert ("pre", "OptimizedModule") in seen and ("post", "OptimizedModule") in seen
    # the runtime calls (eager) are seen; nothing from inside the compiled graph
    assert not {n for _, n in seen} & {"Linear", "ReLU"}


def test_eager_only_marks_code_once_dynamo_is_loaded():
    def hook():
        return None

    dynamo.eager_only(hook)
    assert hook.__code__ in dynamo._MARKED


def test_region_under_inductor_matches_the_graph_inductor_compiled():
    """The default backend: the backward compiles on the first backward; its graph (seen by
    inductor's inner compiler) is the one read before. AOTAutograd's cache is off so that
    inductor really compiles (a cache hit would skip the compiler and keep no metadata).
    Its C++ is scalar (``cpp.vec_isa_ok``): probing the CPU's vector ISA and compiling the
    vector headers took 8 of this test's 11 s on a cold cache (22 s in a CI run), and the
    graphs compared are the same either way."""
    import torch._inductor.config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    seen: list[list[str]] = []

    def inner(gm, example_inputs, **kwargs):
        if kwargs.get("is_backward"):
            seen.append(op_names(gm))
        return compile_fx_inner(gm, example_inputs, **kwargs)

    import gradscope as gs

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    expected = torch.func.grad(lambda w: torch.func.functional_call(
        model, {**dict(model.named_parameters()), "0.weight": w}, (x,)).sum())(model[0].weight)
    with torch._functorch.config.patch(enable_autograd_cache=False), \
            torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        opt = torch.compile(model, backend=functools.partial(compile_fx, inner_compile=inner))
        with gs.scopes(opt):
            out = opt(x)
        region = compiled.read_region(out.grad_fn)
        graph = gs.trace(out, model=opt)
        assert seen == []  # compiled lazily: not yet
        out.sum().backward()
    assert breaks_and_graphs() == (0, 1)
    assert [op.name for op in region.ops] == seen[0]
    (node,) = [n for n in graph.nodes if n.compiled is not None]
    assert [n.name for n in graph.nodes if n.region == node.id and n is not node] == seen[0]
    assert {n.module for n in graph.nodes if n.region and n is not node} <= {
        "<compiled>", "<compiled>.0", "<compiled>.1", "<compiled>.2"}
    torch.testing.assert_close(model[0].weight.grad, expected)
    assert {compiled.dynamo_path(op.modules[-1][1]) for op in region.ops if op.modules} == {
        "0", "1", "2"}
    assert region.note is None


def test_module_hooks_stay_hidden_after_dynamo_reset():
    """``torch._dynamo.reset()`` clears every compile callback; the hooks re-arm on their next
    call, before Dynamo compiles, so a model compiled in the block still does not guard on
    them (no recompile once they are gone)."""
    model = Plain()
    x = torch.randn(3, 4)
    hooks = dynamo.ModuleHooks(lambda m, a: None, lambda m, a, o: None).install()
    try:
        torch._dynamo.reset()
        counters.clear()
        opt = torch.compile(model, backend="aot_eager")
        opt(x)
    finally:
        hooks.remove()
    opt(x)
    assert breaks_and_graphs() == (0, 1)
