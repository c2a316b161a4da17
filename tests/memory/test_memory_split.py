"""Honest memory figures: saved tensors that alias parameters (or inputs, or outputs) are shown
apart from activations in every figure gradscope prints: ``Graph.summary()``,
``MemoryReport.summary()`` and its per-module table, collapsed module boxes (DOT and tree) and
``render --memory`` labels.

Ground truth is measured from torch, without gradscope: the forward runs once more under this
file's own ``saved_tensors_hooks`` pack hook and module hooks, which note every tensor autograd
saves, the module running when it was saved, and whether its storage is alive without the
graph: a parameter's, a buffer's (BatchNorm's running statistics) or an input's.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

import pytest
import torch
from conftest import SAMPLES, run_cli
from rich.console import Console

import gradscope as gs
from gradscope.graph import transforms as graph_transforms
from gradscope.graph.nodes import format_split

SAMPLE_NAMES = ["cnn", "transformer"]


@dataclass
class Truth:
    """Storages saved by one forward, measured from torch."""

    size: dict[int, int] = field(default_factory=dict)  # storage ptr -> untyped nbytes
    param: set[int] = field(default_factory=set)  # storages of parameters, buffers, inputs
    first_module: dict[int, str] = field(default_factory=dict)  # innermost module, first save
    modules: dict[int, set[str]] = field(default_factory=dict)  # every module that saved it

    def split(self, ptrs) -> tuple[int, int]:
        """(activation bytes, parameter bytes) of the storages ``ptrs``."""
        act = sum(self.size[p] for p in ptrs if p not in self.param)
        return act, sum(self.size[p] for p in ptrs if p in self.param)

    def inside(self, path: str) -> set[int]:
        """The storages saved by anything inside the module ``path`` (its subtree)."""
        return {p for p, mods in self.modules.items()
                if any(m == path or m.startswith(path + ".") for m in mods)}


def measure(model: torch.nn.Module, inputs) -> tuple[Truth, torch.Tensor]:
    truth = Truth()
    alive = [*model.parameters(), *model.buffers(), *inputs]
    params = {p.untyped_storage().data_ptr() for p in alive}
    keep: list[torch.Tensor] = []
    stack: list[str] = []
    names = {m: n for n, m in model.named_modules()}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        keep.append(t)  # alive until the end, so no pointer is reused
        truth.size[ptr] = st.nbytes()
        if ptr in params:
            truth.param.add(ptr)
        where = stack[-1] if stack else None
        if where is not None:
            truth.first_module.setdefault(ptr, where)
            truth.modules.setdefault(ptr, set()).add(where)
        return t

    def enter(mod, args) -> None:
        stack.append(names[mod])

    def leave(mod, args, out) -> None:  # returns None: the output stays as it is
        stack.pop()

    handles = []
    for mod in names:
        handles.append(mod.register_forward_pre_hook(enter))
        handles.append(mod.register_forward_hook(leave, always_call=True))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return truth, out


def sample(name: str):
    """(truth measured from torch, gradscope's graph of a second, identical forward)."""
    mf = gs.load_model_file(SAMPLES / f"{name}.py")
    model, inputs, _ = mf.build()
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    torch.manual_seed(0)
    truth, _ = measure(model, inputs)
    torch.manual_seed(0)
    with gs.scopes(model):
        out = model(*inputs)
    return truth, gs.trace(out, model=model, inputs=inputs)


@pytest.fixture(scope="module", params=SAMPLE_NAMES)
def traced(request):
    return request.param, *sample(request.param)


def test_report_splits_parameters_from_activations(traced):
    name, truth, graph = traced
    act, param = truth.split(truth.size)
    rep = graph.memory()
    assert param > 0 and act > 0
    assert (rep.activation_bytes, rep.leaf_bytes, rep.output_bytes) == (act, param, 0)
    summary = rep.summary()
    assert summary.startswith(f"saved tensors hold {gs.format_bytes(act)} of activations")
    assert f"{gs.format_bytes(param)} aliasing parameters/inputs" in summary
    # the graph's one-line summary says the same, activations first, whole storages
    assert graph.summary().endswith(f"holding {format_split(act, param)}")
    assert graph.saved_bytes() == rep.total == act + param


def test_per_module_figures_match_torch(traced):
    name, truth, graph = traced
    rep = graph.memory()
    want: dict[str | None, list[int]] = {}
    for ptr, size in truth.size.items():
        row = want.setdefault(truth.first_module.get(ptr), [0, 0])
        row[ptr in truth.param] += size
    got = {k: [sp.activation, sp.leaf] for k, sp in rep.module_split().items()}
    assert got == want


def depth_one(path: str) -> str:
    """A module path cut to depth 1 (a list item counts with its container: ``stem.0``)."""
    parts = path.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1].isdigit() else parts[0]


def test_module_table_ranks_by_activations(traced):
    name, truth, graph = traced
    rep = graph.memory()
    console = Console(width=120, color_system=None, record=True, file=io.StringIO())
    console.print(rep.render(depth=1))
    lines = console.export_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("module"))
    assert lines[head].split() == ["module", "activations", "share", "params/inputs"]
    rows = [line.split() for line in lines[head + 1:]]
    # ground truth per depth-1 module: the storages first saved inside it
    want: dict[str, tuple[int, int]] = {}
    for top in {depth_one(m) for m in truth.first_module.values()}:
        ptrs = [p for p, m in truth.first_module.items() if depth_one(m) == top]
        want[top] = truth.split(ptrs)
    ranked = sorted(want, key=lambda k: (-want[k][0], -want[k][1]))
    assert [r[0] for r in rows] == ranked
    for r in rows:
        act, param = want[r[0]]
        assert " ".join(r[1:3]) == gs.format_bytes(act)
        assert (" ".join(r[-2:]) if param else r[-1]) == (gs.format_bytes(param) if param else "-")


def test_collapsed_boxes_say_activations_and_parameters(traced):
    name, truth, graph = traced
    view = graph.collapse(1)
    boxes = [n for n in view.nodes if n.kind == "module"]
    assert boxes
    dot = view.to_dot()
    console = Console(width=300, color_system=None, record=True, file=io.StringIO())
    console.print(view.to_tree())
    tree = console.export_text()
    for node in boxes:
        act, param = truth.split(truth.inside(node.module))
        assert (node.box.activation_bytes, node.box.leaf_bytes) == (act, param), node.module
        assert f"saved {format_split(act, param)}" in dot
        if act or param:
            assert f"saved {format_split(act, param)}" in tree
    assert any(n.box.leaf_bytes for n in boxes)
    # a box of boxes (fold or collapse of a collapsed view) still knows its parameters
    whole = view.collapse(0)
    (model_box,) = [n for n in whole.nodes if n.kind == "module"]
    assert model_box.box.leaf_bytes == sum(truth.size[p] for p in truth.param)
    assert gs.Graph.from_json(whole.to_json()) == whole
    assert gs.Graph.from_json(view.to_json()) == view


def test_node_labels_split_each_node(traced):
    name, truth, graph = traced
    rep = graph.memory()
    act, param = truth.split(truth.size)
    splits = rep.node_split()
    assert sum(sp.activation for sp in splits.values()) == act
    assert sum(sp.leaf for sp in splits.values()) == param
    labels = rep.node_labels()
    for nid, sp in splits.items():
        assert labels[nid] == format_split(sp.activation, sp.leaf)
    # a node that saved only a parameter says so, and no activation
    convs = [n for n in graph.nodes if n.name in ("ConvolutionBackward0", "MmBackward0",
                                                  "AddmmBackward0", "EmbeddingBackward0")]
    assert any("params/inputs" in labels.get(n.id, "") for n in convs)


def test_view_bases_are_not_counted_as_outputs():
    x = torch.randn(4, 3, requires_grad=True)
    y = x.exp()
    outs = {"a": y[1:], "b": y[:, 0], "c": (y * 2).sum(), "d": y.t()}
    g = gs.trace(outs)
    bases = [n for n in g.nodes if n.view_base]
    assert len(bases) == 1 and bases[0].tensor.shape == [4, 3]
    kinds = g.summary().split(" (", 1)[1].split(")", 1)[0]
    assert kinds.endswith("4 output, 1 view base")
    assert len(g.roots) == 4


def test_cli_memory_labels_split_activations_and_parameters(tmp_path):
    out = tmp_path / "cnn.dot"
    res = run_cli("render", str(SAMPLES / "cnn.py"), "--memory", "-o", str(out))
    assert res.returncode == 0, res.stderr
    labels = re.findall(r'holds ([^"\\]+)', out.read_text())
    assert labels and any("params/inputs" in lab for lab in labels)
    assert any("activations" in lab for lab in labels)
    truth, graph = sample("cnn")
    act, param = truth.split(truth.size)
    assert f"holding {format_split(act, param)}" in res.stderr


def test_the_box_beyond_a_bounded_view_splits_its_bytes_too():
    x = torch.randn(2, requires_grad=True)
    w = torch.randn(2, requires_grad=True)
    y = x
    for _ in range(50):
        y = y * w  # saves the previous y (an activation, x for the first) and w (a leaf)
    view, hidden = graph_transforms.nearest(gs.trace(y), 10)
    (more,) = [n for n in view.nodes if n.kind == "module"]
    muls_kept = sum(1 for n in view.nodes if n.name == "MulBackward0")
    assert hidden > 0 and more.box.nodes == hidden
    # the 50 - muls_kept products beyond the view: the deepest saved x, the others a y each
    assert more.box.leaf_bytes == x.untyped_storage().nbytes() + w.untyped_storage().nbytes()
    assert more.box.activation_bytes == (50 - muls_kept - 1) * y.untyped_storage().nbytes()
    assert f"saved {format_split(more.box.activation_bytes, more.box.leaf_bytes)}" in view.to_dot()
