"""DOT clusters by module path, module boxes, and the view `gradscope render` picks for big
graphs."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
from conftest import SAMPLES

import gradscope as gs
from gradscope.views.graphviz import dot_binary
from gradscope.model.transforms import readable_view


def traced(sample: str) -> tuple[gs.Graph, torch.nn.Module]:
    fwd = gs.load_model_file(SAMPLES / sample).forward()
    return gs.trace(fwd.outputs, model=fwd.model), fwd.model


def clusters_of(dot: str) -> list[tuple[str, str | None, set[str]]]:
    """Each cluster as (label, parent cluster's label, ids of the nodes declared directly in it)."""
    out: list[tuple[str, str | None, set[str]]] = []
    stack: list[int] = []
    pending = False
    for line in dot.splitlines():
        s = line.strip()
        if s.startswith("subgraph cluster_"):
            pending = True
        elif pending:
            label = re.search(r'label="([^"]*)"', s).group(1)
            out.append((label, out[stack[-1]][0] if stack else None, set()))
            stack.append(len(out) - 1)
            pending = False
        elif s == "}" and stack:
            stack.pop()
        elif stack and (m := re.match(r"^([nm]\d+) \[", s)):
            out[stack[-1]][2].add(m.group(1))
    return out


def test_clusters_follow_module_paths() -> None:
    graph, model = traced("transformer.py")
    cls = {name: type(m).__name__ for name, m in model.named_modules()}
    found = {(label, parent) for label, parent, _ in clusters_of(graph.to_dot())}
    layer = f"layers.1: {cls['encoder.layers.1']}"
    assert (f"encoder: {cls['encoder']}", None) in found
    assert (layer, f"encoder: {cls['encoder']}") in found
    assert (f"self_attn: {cls['encoder.layers.1.self_attn']}", layer) in found
    assert (f"linear2: {cls['encoder.layers.1.linear2']}", layer) in found
    # every node of head (ops, AccumulateGrad, and the parameters' leaves) is inside its cluster
    head_label = f"head: {cls['head']}"
    head = next(ids for label, _, ids in clusters_of(graph.to_dot()) if label == head_label)
    expected = {n.id for n in graph.nodes if n.module == "head" or n.name.startswith("head.")}
    assert expected and head == expected


def test_graph_without_modules_is_unchanged() -> None:
    x = torch.randn(3, requires_grad=True)
    graph = gs.trace((x.exp() * 2).sum(), params={"x": x})
    assert "subgraph" not in graph.to_dot()
    assert graph.to_dot() == gs.views.dot.to_dot(graph, clusters=False)


@pytest.mark.skipif(dot_binary() is None, reason="the Graphviz binary is not installed")
def test_clustered_and_collapsed_dot_lays_out() -> None:
    graph, _ = traced("transformer.py")
    for view in (graph, graph.collapse(2), graph.fold()):
        cmd = [dot_binary(), "-Tsvg"]
        proc = subprocess.run(cmd, input=view.to_dot().encode(), capture_output=True)
        assert proc.returncode == 0, proc.stderr.decode()


def test_module_boxes_in_dot() -> None:
    graph, _ = traced("transformer.py")
    view = graph.collapse(2)
    dot = view.to_dot()
    box = next(n for n in view.nodes if n.module == "encoder.layers.0")
    line = next(ln for ln in dot.splitlines() if ln.strip().startswith(f"{box.id} ["))
    assert f"TransformerEncoderLayer · {box.box.nodes} nodes" in line and "box3d" in line
    assert f"{box.id}_s0" not in dot  # a box stands for many nodes: no saved-tensor boxes
    assert re.search(r'-> m\d+ \[label="x2"', dot)  # merged edges carry their count


@pytest.fixture(scope="module")
def deep() -> gs.Graph:
    return traced("deep_encoder.py")[0]


def test_readable_view_of_a_big_graph(deep: gs.Graph) -> None:
    view, note = readable_view(deep)
    assert len(view.nodes) < 30 and note == (
        "folded repeated layers (encoder.layers.0-63 x64); use --no-fold to expand"
    )
    view, note = readable_view(deep, fold_repeats=False)
    assert len(view.nodes) <= 1500
    assert note.startswith(f"collapsed to depth 3 because the graph has {len(deep.nodes)} nodes; ")
    assert note.endswith("use --depth or --full to expand")
    assert readable_view(deep, full=True) == (deep, None)
    view, note = readable_view(deep, depth=1, fold_repeats=False)
    assert note is None
    assert [n.name for n in view.nodes if n.kind == "module"] == ["head", "encoder", "embed"]


def test_readable_view_leaves_small_graphs_alone() -> None:
    graph, _ = traced("transformer.py")
    assert readable_view(graph) == (graph, None)
    folded, note = readable_view(graph, fold_repeats=True)
    assert note and "encoder.layers.0-1 x2" in note and len(folded.nodes) < len(graph.nodes)
