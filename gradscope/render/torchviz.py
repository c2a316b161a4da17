"""The torchviz-compatible drawing behind ``gradscope.make_dot``, a drop-in for
``torchviz.make_dot`` (``make_dot`` itself traces, in ``gradscope/__init__.py``, and calls
``dot_from_graph`` here).

Same node labels and colours as torchviz on every graph torchviz can draw, built from the
iterative walk, so it also draws what torchviz cannot: graphs deeper than the recursion limit,
list/dict outputs, graphs whose saved tensors backward already freed, custom Functions that
saved ``None``. Node ids are stable (``n0``...) instead of ``id()``, so the source is the same on
every run.
"""

from __future__ import annotations

from typing import Any

from ..graph.graph import Graph
from ..output.style import (
    BASE_COLOR,
    LEAF_COLOR,
    OUTPUT_COLOR,
    SAVED_COLOR,
    var_label,
)
from .dot_nodes import attr_entries, attr_table


def dot_from_graph(
    graph: Graph, *, show_attrs: bool = False, show_saved: bool = False, max_attr_chars: int = 50
) -> Any:
    """A torchviz-style ``graphviz.Digraph`` of an already traced ``graph``."""
    from graphviz import Digraph

    node_attr = dict(
        style="filled",
        shape="box",
        align="left",
        fontsize="10",
        ranksep="0.1",
        height="0.2",
        fontname="monospace",
    )
    dot = Digraph(node_attr=node_attr, graph_attr=dict(size="12,12"))
    for node in graph.nodes:
        nid = node.id
        if node.kind == "output":
            color = BASE_COLOR if node.view_base else OUTPUT_COLOR
            dot.node(
                nid, var_label("", node.tensor.shape if node.tensor else None), fillcolor=color
            )
            continue
        if node.kind == "leaf":
            dot.node(
                nid,
                var_label(node.name, node.tensor.shape if node.tensor else None),
                fillcolor=LEAF_COLOR,
            )
            continue
        if node.kind == "custom":
            label = node.name  # torchviz lists no attributes for custom Functions
            saved_custom = [s for s in node.saved if s.name.startswith("saved_tensors")]
        else:
            entries = attr_entries(node) if show_attrs else {}
            label = attr_table(node.name, entries, max_attr_chars)
            saved_custom = []
        if show_saved and node.kind != "custom":
            for i, s in enumerate(node.saved):
                sid = f"{nid}_s{i}"
                dot.edge(nid, sid, dir="none")
                dot.node(
                    sid,
                    var_label(s.name, s.shape) if not s.freed else f"{s.name}\n (freed)",
                    fillcolor=SAVED_COLOR,
                )
        dot.node(nid, label)
        for i, s in enumerate(saved_custom):
            sid = f"{nid}_s{i}"
            dot.edge(sid, nid, dir="none")
            dot.node(
                sid, var_label("", s.shape) if not s.freed else "\n (freed)", fillcolor=SAVED_COLOR
            )
    for e in graph.edges:
        if e.kind == "view":
            dot.edge(e.dst, e.src, style="dotted")
        else:
            dot.edge(e.dst, e.src)
    _resize_graph(dot)
    return dot


def _resize_graph(dot: Any, size_per_element: float = 0.15, min_size: int = 12) -> None:
    """torchviz's sizing rule: grow the canvas with the number of statements."""
    size = max(min_size, len(dot.body) * size_per_element)
    dot.graph_attr.update(size=f"{size},{size}")
