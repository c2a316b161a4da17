"""Renderers: golden files for DOT, tree and JSON (stable ids make them byte-stable), and the
image formats through the Graphviz binary."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
import torch
from golden_models import scoped_net
from graphs import ALL, custom_saved_none
from rich.console import Console

import gradscope as gs


def small_model_graph(backward: bool = False) -> gs.Graph:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    loss = m(torch.randn(3, 4)).pow(2).mean()
    if backward:
        loss.backward()
    return gs.trace(loss, params=m)


def tree_text(graph: gs.Graph, **kw) -> str:
    console = Console(color_system=None, width=100, file=io.StringIO(), legacy_windows=False)
    console.print(gs.render_tree(graph, **kw))
    return console.file.getvalue()


def test_dot_golden(golden):
    golden("mlp.dot", small_model_graph().to_dot())
    golden("mlp_attrs.dot", small_model_graph().to_dot(attrs=True, saved=False))
    golden("custom.dot", gs.trace(*custom_saved_none()).to_dot(attrs=True))


def test_dot_golden_after_backward(golden):
    golden("mlp_freed.dot", small_model_graph(backward=True).to_dot())


def test_json_golden(golden):
    golden("mlp.json", small_model_graph().to_json())


def test_tree_golden(golden):
    golden("mlp.tree.txt", tree_text(small_model_graph()))
    golden("lstm.tree.txt", tree_text(gs.trace(*ALL["lstm_cell"]())))
    golden("custom.tree.txt", tree_text(gs.trace(*custom_saved_none())))


def test_dot_colours_follow_torchviz():
    text = gs.trace(*ALL["views"]()).to_dot()
    assert 'fillcolor="lightblue"' in text  # leaf
    assert 'fillcolor="orange"' in text  # saved
    assert 'fillcolor="darkolivegreen1"' in text  # output
    assert 'fillcolor="darkolivegreen3"' in text  # view base
    assert "style=dotted" in text
    custom = gs.trace(*custom_saved_none()).to_dot()
    assert "(custom Function)" in custom and "peripheries" in custom


def test_dot_escapes_awkward_names():
    x = torch.randn(2, requires_grad=True)
    g = gs.trace({'we"ird\\key': x.exp()}, params={'p"1': x})
    text = g.to_dot()
    assert 'p\\"1' in text and "ird" in text
    if gs.dot_binary():
        assert g.to_bytes("svg").startswith(b"<?xml")


def test_tree_shows_each_node_once_with_references():
    x = torch.randn(3, requires_grad=True)
    y = x.exp()
    g = gs.trace(y * y + y, params={"x": x})
    text = tree_text(g)
    assert text.count("ExpBackward0") == 3  # once in full, twice as a reference
    # y is drawn on the spine, after both uses of it name it (the skip path of y * y + y)
    assert text.count("(shown below)") == 2 and "(shown above)" not in text
    assert text.count("AccumulateGrad ← x") == 1


def test_tree_shows_a_view_base_once_and_a_repeated_root_as_a_reference():
    """A view output's base is drawn under the view; it is not listed again as a root of its
    own ("↺ view base ... (shown above)" once ended the tree). A root the caller asked for is
    still listed, as a reference, when another root's tree already showed it."""
    x = torch.randn(4, 4, requires_grad=True)
    base = x * 2
    view = base.view(16)
    text = tree_text(gs.trace(view, params={"x": x}))
    assert text.count("view base output._base") == 1, text
    assert "↺ view base" not in text
    y = x.exp()
    z = y.sum()
    both = tree_text(gs.trace([z, y], params={"x": x}))
    assert both.count("(shown above)") == 1 and "↺ ExpBackward0" in both, both


def test_tree_depth_grows_with_branching_not_length():
    x = torch.randn(2, requires_grad=True)
    y = x
    for _ in range(300):
        y = torch.tanh(y) * 1.5
    text = tree_text(gs.trace(y, params={"x": x}))
    widest = max(len(line) - len(line.lstrip(" │├└─")) for line in text.splitlines())
    assert widest < 10


def test_tree_max_lines():
    x = torch.randn(2, requires_grad=True)
    y = x
    for _ in range(50):
        y = y.sin()
    graph = gs.trace(y)
    lines = tree_text(graph, max_lines=10).splitlines()
    assert lines[-1] == "… 42 more nodes not shown (raise --max-lines)"
    # 10 lines of tree, after the summary's two lines
    assert lines[:-11] == list(graph.summary_parts())
    assert ", ".join(lines[:-11]) == graph.summary()
    assert [line.split()[0] for line in lines[-11:-1]] == ["output"] + ["SinBackward0"] * 9


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs the Graphviz binary")
@pytest.mark.parametrize("fmt,magic", [("svg", b"<?xml"), ("png", b"\x89PNG"), ("pdf", b"%PDF")])
def test_image_formats(tmp_path, fmt, magic):
    g = small_model_graph()
    path = g.save(tmp_path / f"g.{fmt}")
    assert path.read_bytes().startswith(magic)


def test_save_text_formats_and_errors(tmp_path, monkeypatch):
    g = small_model_graph()
    assert g.save(tmp_path / "g.dot").read_text() == g.to_dot()
    assert gs.Graph.from_json(g.save(tmp_path / "g.json").read_text()) == g
    with pytest.raises(gs.FormatError, match="unknown output format 'bmp'"):
        g.save(tmp_path / "g.bmp")
    with pytest.raises(gs.FormatError, match="no suffix"):
        g.save(tmp_path / "graph")
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` here
    with pytest.raises(gs.GraphvizNotFoundError, match="apt-get install graphviz.*-o graph.dot"):
        g.save(tmp_path / "g.svg")
    assert g._repr_svg_() is None


# ---------------------------------------------------------------------------- structured goldens
def test_structured_dot_goldens(golden, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # forward lines relative to ROOT
    graph, loss, net = scoped_net()
    golden("net_clusters.dot", graph.to_dot())
    golden("net_depth1.dot", graph.collapse(1).to_dot())
    golden("net_folded.dot", graph.fold().to_dot())
    # the CLI's default picture of a folded graph: one member drawn, the legend under it
    view, _ = gs.readable_view(graph, fold_repeats=True)
    golden("net_readable.dot", view.to_dot(legend=True))
    with gs.record_backward(loss, model=net) as rec:
        loss.backward()
    golden("net_backward.dot", rec.graph.to_dot(saved=False))
    golden("net_backward.tree.txt", tree_text(rec.graph))


def test_html_data_block_golden(golden):
    from gradscope.render.html import graph_data

    graph, _, _ = scoped_net()
    data = graph_data(graph.fold())
    import json

    golden("net_folded.html-data.json", json.dumps(data, indent=1, sort_keys=True) + "\n")
    # the page of the whole graph: containers for the modules, a fold of the 4 blocks
    data = graph_data(graph)
    golden("net.html-data.json", json.dumps(data, indent=1, sort_keys=True) + "\n")


def test_a_forward_nan_node_is_drawn_red_with_its_forward_line():
    """The node where the forward first made NaN: filled red, its mark, and the line that made
    it (issue 27 item 4), with or without a non-finite gradient of its own."""
    from gradscope.graph.graph import Edge, Graph, Node

    where = "/tmp/m.py:11: bad = h.log()   # NaN where h < 0"
    for grad in (None, "nan"):
        log = Node("n1", "LogBackward0", "op", created_at=where, forward_nonfinite="nan",
                   nonfinite=grad)
        dot = Graph([Node("n0", "SumBackward0", "op", created_at="/tmp/m.py:12: s"), log],
                    [Edge("n0", "n1")], roots=["n0"]).to_dot()
        line = next(ln for ln in dot.splitlines() if ln.strip().startswith("n1 "))
        assert 'fillcolor=red' in line or 'fillcolor="red"' in line, line
        assert "nan first made here, in the forward" in line
        assert "m.py:11:" in line and "bad = h.log()" in line
        assert "m.py:12" not in dot  # a node with nothing non-finite gets no line


def test_tree_header_is_two_lines_that_fit_80_columns():
    """The summary's structure and memory on two lines: as one it passes 80 columns even for
    ``x.sin()`` (97), and ``gradscope tree | head`` is read in 80."""
    x = torch.randn(2, requires_grad=True)
    graph = gs.trace(x.sin())
    head = tree_text(graph).splitlines()[:2]
    assert ", ".join(head) == graph.summary() and len(graph.summary()) > 80
    assert head == ["4 nodes (1 op, 1 accumulate, 1 leaf, 1 output), 3 edges",
                    "1 saved tensor holding 8 B params/inputs"]


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz")
def test_graphviz_lays_out_every_golden_picture_without_a_warning(monkeypatch):
    """What a user's own ``dot`` says about gradscope's DOT: nothing (the legend's colour
    swatches held a space taller than their 9-point cells: four warnings a picture)."""
    import subprocess

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    graph, loss, net = scoped_net()
    view, _ = gs.readable_view(graph, fold_repeats=True)
    for name, source in (("legend", view.to_dot(legend=True)), ("clusters", graph.to_dot()),
                         ("folded", graph.fold().to_dot())):
        proc = subprocess.run(["dot", "-Tsvg"], input=source, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", (name, proc.stderr)
