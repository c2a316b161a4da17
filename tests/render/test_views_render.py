"""DOT clusters by module path, module boxes, and the view `gradscope render` picks for big
graphs."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
from conftest import SAMPLES, run_cli

import gradscope as gs
from gradscope.graph.transforms import readable_view
from gradscope.render import dot as render_dot
from gradscope.render.graphviz import dot_binary


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
    assert graph.to_dot() == render_dot.to_dot(graph, clusters=False)


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
    # one layer is drawn as it is, the other 63 are one box that says what it stands for
    boxes = [n for n in view.nodes if n.kind == "module"]
    assert [(b.name, b.box.repeat, b.box.shown) for b in boxes] == [
        ("encoder.layers.0-63 x64", 64, "encoder.layers.0")
    ]
    layer0 = [n for n in deep.nodes if (n.module or "").startswith("encoder.layers.0.")
              or n.module == "encoder.layers.0"]
    kept = {n.id for n in view.nodes}
    assert layer0 and all(n.id in kept for n in layer0)
    assert boxes[0].box.nodes + len(view.nodes) - 1 == len(deep.nodes)
    assert note.startswith(
        f"{len(deep.nodes)} nodes drawn as {len(view.nodes)}: folded repeated layers "
        "(encoder.layers.0-63 x64; one of each drawn); to see more use --no-fold (every repeat), "
        "--depth N (modules down to depth N), --full (every node"
    ) and "-o graph.html" in note
    view, note = readable_view(deep, fold_repeats=False)
    assert len(view.nodes) <= 1500
    assert note.startswith(f"{len(deep.nodes)} nodes drawn as {len(view.nodes)}: collapsed to "
                           "depth 3; ")
    assert all(way in note for way in ("--no-fold", "--depth N", "--full"))
    assert readable_view(deep, full=True) == (deep, None)
    view, note = readable_view(deep, depth=1, fold_repeats=False)
    assert note is None
    assert [n.name for n in view.nodes if n.kind == "module"] == ["head", "encoder", "embed"]


def test_readable_view_leaves_small_graphs_alone() -> None:
    graph, _ = traced("transformer.py")
    assert readable_view(graph) == (graph, None)
    folded, note = readable_view(graph, fold_repeats=True)
    assert note and "encoder.layers.0-1 x2" in note and len(folded.nodes) < len(graph.nodes)


# ---------------------------------------------------------------------- compact pictures
def svg_area(svg: str) -> int:
    m = re.search(r'<svg width="(\d+)pt" height="(\d+)pt"', svg)
    assert m, svg[:300]
    return int(m.group(1)) * int(m.group(2))


@pytest.mark.skipif(dot_binary() is None, reason="the Graphviz binary is not installed")
@pytest.mark.parametrize("sample", ["transformer.py", "cnn.py"])
def test_svg_no_larger_than_torchviz(sample: str, tmp_path) -> None:
    """At the CLI's default settings (clusters, saved tensors, legend) the picture is at most
    1.2x the area of torchviz's make_dot(show_saved=True) picture of the same graph."""
    torchviz = pytest.importorskip("torchviz")
    out = tmp_path / "g.svg"
    proc = run_cli("render", str(SAMPLES / sample), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    ours = out.read_text(encoding="utf-8")
    assert ours.count('class="cluster"') >= 4  # the module clusters are kept
    fwd = gs.load_model_file(SAMPLES / sample).forward()
    params = dict(fwd.model.named_parameters())
    theirs = torchviz.make_dot(fwd.outputs, params=params, show_saved=True).pipe(format="svg")
    ratio = svg_area(ours) / svg_area(theirs.decode("utf-8"))
    assert ratio <= 1.2, f"{sample}: {ratio:.2f}x torchviz's area"


def test_fold_draws_its_first_member(deep: gs.Graph) -> None:
    """The default view of the 64-layer encoder: a cluster for the fold holds layer 0's own
    cluster (with its sub-modules) and one box for layers 1-63."""
    view, _ = readable_view(deep)
    dot = view.to_dot()
    labels = [label for label, _, _ in clusters_of(dot)]
    fold = "layers.0-63 x64: TransformerEncoderLayer (layers.0 drawn, the others alike)"
    assert fold in labels
    parents = {label: parent for label, parent, _ in clusters_of(dot)}
    assert parents["layers.0: TransformerEncoderLayer"] == fold
    assert parents["self_attn: MultiheadAttention"] == "layers.0: TransformerEncoderLayer"
    box = next(n for n in view.nodes if n.kind == "module")
    assert box.id in next(ids for label, _, ids in clusters_of(dot) if label == fold)
    line = next(ln for ln in dot.splitlines() if ln.strip().startswith(f"{box.id} ["))
    assert "layers.1-63 x63\\nlike layers.0" in line


def test_legend_lists_what_the_picture_uses(deep: gs.Graph) -> None:
    x = torch.randn(3, requires_grad=True)
    plain = gs.trace((x + 1).sum(), params={"x": x}).to_dot(legend=True)
    legend = next(ln for ln in plain.splitlines() if "labelloc=b" in ln)
    assert ">op<" in legend.replace("  ", "") and "leaf" in legend and "output" in legend
    assert "saved tensor" not in legend and "repeated layers" not in legend  # none in it
    assert "gradient norm" not in legend and "dashed frame" not in legend
    assert "labelloc=b" not in gs.trace((x * 2).sum()).to_dot()  # off unless asked
    view, _ = readable_view(deep)
    legend = next(ln for ln in view.to_dot(legend=True).splitlines() if "labelloc=b" in ln)
    for item in ("saved tensor", "repeated layers", "dashed frame: module",
                 "xN: N edges merged"):
        assert item in legend, item
    # a view base where the output is a view (whether the deep sample's output is one
    # depends on torch: 2.15's linear over 3-D input returns UnsafeView, not a view)
    viewed = gs.trace((x * 2).view(3, 1), params={"x": x}).to_dot(legend=True)
    legend = next(ln for ln in viewed.splitlines() if "labelloc=b" in ln)
    assert "view base" in legend


def test_forward_lines_are_short_and_wrapped() -> None:
    from gradscope.render.dot_nodes import short_location, wrap_location

    where = "/home/u/proj/models/net.py:12: y = torch.where(h > 0, h.sqrt(), torch.zeros_like(h))"
    assert short_location(where, "/home/u/proj") == (
        "models/net.py:12: y = torch.where(h > 0, h.sqrt(), torch.zeros_like(h))")
    assert short_location(where, "/elsewhere").startswith("…/models/net.py:12: ")
    lines = wrap_location(short_location(where, "/home/u/proj/models"))
    assert lines[0] == "net.py:12:" and max(len(ln) for ln in lines) <= 40
    assert " ".join(lines[1:]) == "y = torch.where(h > 0, h.sqrt(), torch.zeros_like(h))"
