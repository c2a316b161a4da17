"""``gradscope.make_dot``: a drop-in for ``torchviz.make_dot``.

Same node labels and colours as torchviz on every graph torchviz can draw, built from the
iterative walk, so it also draws what torchviz cannot: graphs deeper than the recursion limit,
list/dict outputs, graphs whose saved tensors backward already freed, custom Functions that
saved ``None``. Node ids are stable (``n0``...) instead of ``id()``, so the source is the same on
every run.
"""

from __future__ import annotations

from typing import Any

from ._capture import trace
from ._model import Graph
from ._render_dot import (
    BASE_COLOR,
    LEAF_COLOR,
    OUTPUT_COLOR,
    SAVED_COLOR,
    attr_entries,
    attr_table,
    var_label,
)


def make_dot(
    var: Any,
    params: Any = None,
    show_attrs: bool = False,
    show_saved: bool = False,
    max_attr_chars: int = 50,
) -> Any:
    """Graphviz representation of the autograd graph, as ``torchviz.make_dot`` draws it.

    Args:
        var: output tensor, or any nest (tuple/list/dict/dataclass) of tensors.
        params: dict of name -> tensor (or an ``nn.Module``) to name the leaf tensors.
        show_attrs: show non-tensor attributes of backward nodes.
        show_saved: draw tensors saved by built-in backward nodes (custom Functions' saved
            tensors are always drawn, as torchviz does).
        max_attr_chars: with ``show_attrs``, truncate attribute values to this many characters.

    Returns:
        A ``graphviz.Digraph``: ``.source`` for DOT text, ``.render()`` / ``.pipe()`` for images.

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.randn(3, requires_grad=True)
        >>> dot = gs.make_dot((x * 2).sum(), params={"x": x})
        >>> "MulBackward0" in dot.source
        True
    """
    graph = trace(var, params=params, saved=True)  # custom Functions' tensors are always drawn
    return dot_from_graph(
        graph, show_attrs=show_attrs, show_saved=show_saved, max_attr_chars=max_attr_chars
    )


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
            color = BASE_COLOR if node.attrs.get("view_base") else OUTPUT_COLOR
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
