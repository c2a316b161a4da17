"""Collapse, fold and auto-depth: totals preserved, boxes matching named_modules() (the ground
truth for which modules exist and of what class), the 64 repeats of a 64-layer encoder found."""

from __future__ import annotations

import pytest
import torch
from conftest import SAMPLES
from torch import nn

import gradscope as gs
from gradscope.errors import ViewError
from gradscope.graph.paths import levels
from gradscope.graph.transforms import (
    auto_depth,
    collapse,
    collapsed_size,
    fold,
    fold_runs,
)


def traced(sample: str) -> tuple[gs.Graph, nn.Module]:
    fwd = gs.load_model_file(SAMPLES / sample).forward()
    return gs.trace(fwd.outputs, model=fwd.model), fwd.model


@pytest.fixture(scope="module")
def deep() -> tuple[gs.Graph, nn.Module]:
    return traced("deep_encoder.py")


def total_nodes(graph: gs.Graph) -> int:
    return sum(n.count for n in graph.nodes)


def test_levels_keep_list_items_with_their_container() -> None:
    assert levels("encoder.layers.3.self_attn.out_proj") == [
        "encoder", "layers.3", "self_attn", "out_proj"
    ]
    assert levels("blocks.0#2.attn") == ["blocks.0#2", "attn"]
    assert levels("0.1") == ["0.1"] and levels("") == []


@pytest.mark.parametrize("sample", ["transformer.py", "cnn.py"])
def test_collapse_preserves_totals_and_matches_named_modules(sample: str) -> None:
    graph, model = traced(sample)
    modules = dict(model.named_modules())
    for depth in range(0, 5):
        view = collapse(graph, depth)
        assert total_nodes(view) == len(graph.nodes)
        assert view.saved_bytes() == graph.saved_bytes()
        assert len(view.nodes) == collapsed_size(graph, depth)
        for box in (n for n in view.nodes if n.kind == "module"):
            assert box.module in modules, f"{box.module} is not in named_modules()"
            assert box.box.cls == type(modules[box.module]).__name__
            assert len(levels(box.module)) == depth
            ops_inside = sum(
                1 for n in graph.nodes
                if n.kind in ("op", "custom") and n.module is not None
                and (not box.module or f"{n.module}.".startswith(f"{box.module}."))
            )
            assert ops_inside <= box.box.nodes
        assert gs.Graph.from_json(view.to_json()) == view


def test_collapsed_edges_are_merged_with_counts() -> None:
    graph, _ = traced("transformer.py")
    view = collapse(graph, 2)
    group = {}  # original id -> view id, rebuilt here from the module paths
    box_of = {n.module: n.id for n in view.nodes if n.kind == "module"}
    acc_of = {e.dst: e.src for e in graph.edges if graph.node(e.src).kind == "accumulate"}
    for n in graph.nodes:
        path = graph.node(acc_of[n.id]).module if n.kind == "leaf" else n.module
        key = ".".join(levels(path)[:2]) if path is not None and len(levels(path)) >= 2 else None
        group[n.id] = box_of[key] if key is not None else n.id
    crossing = [e for e in graph.edges if group[e.src] != group[e.dst]]
    assert sum(e.count for e in view.edges) == len(crossing)
    pairs = [(e.src, e.dst, e.kind) for e in view.edges if e.count > 1]
    assert pairs and len(pairs) == len(set(pairs))  # merged: one edge per pair of groups
    layer0, layer1 = box_of["encoder.layers.0"], box_of["encoder.layers.1"]
    between = [e for e in view.edges if (e.src, e.dst) == (layer1, layer0)]
    assert len(between) == 1 and between[0].count >= 2  # residual path + attention input


def test_negative_depth_is_refused() -> None:
    with pytest.raises(ViewError, match="0 or more"):
        collapse(gs.Graph(), -1)


def test_fold_finds_the_64_layers(deep: tuple[gs.Graph, nn.Module]) -> None:
    graph, model = deep
    layers = model.encoder.layers
    view = fold(graph)
    boxes = [n for n in view.nodes if n.kind == "module"]
    assert [b.name for b in boxes] == [f"encoder.layers.0-{len(layers) - 1} x{len(layers)}"]
    assert boxes[0].box.repeat == 64 and len(layers) == 64
    assert boxes[0].box.cls == type(layers[0]).__name__
    assert total_nodes(view) == len(graph.nodes)
    assert view.saved_bytes() == graph.saved_bytes()
    # everything outside the layers is left alone
    outside = [n for n in graph.nodes if not (n.module or "").startswith("encoder.layers.")
               and not n.name.startswith("encoder.layers.")]
    assert len(view.nodes) == len(outside) + 1
    assert gs.Graph.from_json(view.to_json()) == view


def test_fold_keeps_different_siblings_apart() -> None:
    net = nn.Sequential(
        nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 8), nn.Linear(8, 8)
    )
    x = torch.randn(3, 4, requires_grad=True)
    with gs.scopes(net):
        out = net(x)
    view = fold(gs.trace(out, model=net))
    names = sorted(
        n.name if n.kind == "module" else n.module or "-" for n in view.nodes if n.kind != "leaf"
    )
    assert "0-2 x3" in names
    assert "3" in names and "4" in names  # different shapes: not folded


def test_fold_repeated_calls() -> None:
    class Loop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(5):
                x = self.block(x)
            return x

    model = Loop()
    with gs.scopes(model):
        out = model(torch.randn(2, 4, requires_grad=True))
    view = fold(gs.trace(out, model=model))
    boxes = [n for n in view.nodes if n.kind == "module"]
    assert [b.name for b in boxes] == ["block#0-4 x5"]
    # the parameters (owned by the first call) fold into the box too; left: output and input x
    assert [n.kind for n in view.nodes] == ["output", "module", "accumulate", "leaf"]
    assert boxes[0].box.cls == "Linear"


def test_auto_depth(deep: tuple[gs.Graph, nn.Module]) -> None:
    graph, _ = deep
    assert auto_depth(graph, max_nodes=len(graph.nodes)) is None
    depth = auto_depth(graph, max_nodes=1500)
    assert depth is not None
    assert len(collapse(graph, depth).nodes) <= 1500 < len(collapse(graph, depth + 1).nodes)
    assert auto_depth(graph, max_nodes=1) == 0


def test_class_names_survive_json() -> None:
    graph, model = traced("transformer.py")
    again = gs.Graph.from_json(graph.to_json())
    modules = dict(model.named_modules())
    boxes = [n for n in again.collapse(2).nodes if n.kind == "module"]
    assert boxes and all(b.box.cls == type(modules[b.module]).__name__ for b in boxes)


def test_fold_keeping_the_first_member(deep: tuple[gs.Graph, nn.Module]) -> None:
    graph, model = deep
    view = fold(graph, keep_first=True)
    boxes = [n for n in view.nodes if n.kind == "module"]
    assert [(b.name, b.box.repeat, b.box.shown) for b in boxes] == [
        ("encoder.layers.0-63 x64", 64, "encoder.layers.0")
    ]
    # layer 0 is kept node for node; the box stands for the other 63 (and nothing is lost)
    kept = [n for n in view.nodes if n.kind != "module" and (n.module or "").startswith(
        "encoder.layers.0")]
    in_layer0 = [n for n in graph.nodes if (n.module or "").startswith("encoder.layers.0")
                 and (n.module == "encoder.layers.0" or n.module.startswith("encoder.layers.0."))]
    assert {n.id for n in kept} == {n.id for n in in_layer0}
    assert total_nodes(view) == len(graph.nodes)
    assert view.saved_bytes() == graph.saved_bytes()
    # the gradient from layer 1 into layer 0 now comes from the box
    assert any(e.src == boxes[0].id and e.dst in {n.id for n in kept} for e in view.edges)


def test_fold_runs(deep: tuple[gs.Graph, nn.Module]) -> None:
    graph, model = deep
    runs = fold_runs(graph)
    assert [(r.path, r.name, r.repeat, r.cls) for r in runs] == [
        ("encoder.layers.0-63", "encoder.layers.0-63 x64", 64, "TransformerEncoderLayer")
    ]
    assert runs[0].members == tuple(f"encoder.layers.{i}" for i in range(64))
    with pytest.raises(ViewError, match="inside must be"):
        fold_runs(graph, inside="some")


def test_nested_runs_inside_a_fold() -> None:
    """Runs inside a run's members: searched in the first member only, or in all of them."""
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for h in self.heads:
                x = h(x)
            return x

    net = nn.Sequential(Block(), Block())
    with gs.scopes(net):
        out = net(torch.randn(2, 4, requires_grad=True))
    graph = gs.trace(out, model=net)
    assert [r.name for r in fold_runs(graph)] == ["0-1 x2"]
    assert [r.name for r in fold_runs(graph, inside="first")] == ["0-1 x2", "0.heads.0-2 x3"]
    names = sorted(r.name for r in fold_runs(graph, inside="all"))
    assert names == ["0-1 x2", "0.heads.0-2 x3", "1.heads.0-2 x3"]
    view = fold(graph, keep_first=True)
    shown = sorted(n.box.shown for n in view.nodes if n.kind == "module")
    assert shown == ["0", "0.heads.0"]
    assert total_nodes(view) == len(graph.nodes)
