"""DOT text from a ``Graph``: torchviz's colours and shapes, built as a string (fast, and
byte-identical on every run because node ids are stable).

When nodes carry module paths (``gs.scopes``), each module is a nested ``subgraph cluster_*``
labelled ``name: Class`` (a list item such as ``layers.3`` is one level, as in
``gradscope.graph.paths.levels``); root-level ops and nodes with no module stay at the top
level. Clustered pictures are kept compact: a node's saved tensors and a parameter's
``leaf -> AccumulateGrad`` chain sit on the rank of the op that uses them (``rank=same``; the
saved boxes in a row, each linked to the one before it and the first to the op), so a
module spans only its ops' ranks and consecutive modules stack instead of spreading sideways
(torchviz's layout, with clusters, was 1.4-2.5x its area). A fold that keeps its first member
(``fold(keep_first=True)``) is a cluster holding that member's clusters and one box for the
others. A graph without module paths gives exactly the DOT it gave before clusters existed.

This module holds ``to_dot`` (the graph statement, its edges) and registers the ``dot`` format;
the parts it puts together are in ``dot_tokens`` (quoted strings, box ids), ``dot_nodes`` (a
node's label, colours and saved boxes), ``dot_clusters`` (module clusters) and ``dot_legend``.
"""

from __future__ import annotations

import math
import os

from ..graph.graph import Edge, Graph
from ..output.formats import FormatKind, OutputFormat, register_format
from ..output.style import format_norm, norm_color
from .dot_clusters import (
    _cluster_keys,
    _cluster_lines,
    flat_edges,
    param_chains,
)
from .dot_legend import legend_line
from .dot_nodes import _lines_into, _Options
from .dot_tokens import _Ids, quote

NODE_ATTR = (
    'style=filled shape=box align=left fontsize=10 ranksep=0.1 height=0.2 fontname=monospace'
)


#: Over this many parameter chains (``{rank=same; leaf; AccumulateGrad; op}``), the labels of
#: edges inside a chain (gradient norms, ``--backward``) are written as ``xlabel``: a plain
#: label is a node of its own on a flat edge, and with hundreds of them in nested clusters
#: Graphviz's ranker runs for minutes (DenseNet-121: over 100 s unfinished, 18 s of CPU with
#: xlabel). An xlabel is placed without room made for it, so small pictures keep ``label``.
XLABEL_CHAINS = 128


def _edge_attrs(e: Edge, flat: bool = False) -> str:
    parts = []
    label = []
    if e.count != 1:
        label.append(f"x{e.count}")
    if e.grad_norm is not None:
        label.append(format_norm(e.grad_norm))
        color = norm_color(e.grad_norm)
        parts.append(f"color={quote(color)} fontcolor={quote(color)}")
        if not math.isfinite(e.grad_norm):
            parts.append("penwidth=2.5")
    parts.insert(0, f"{'xlabel' if flat else 'label'}={quote(' '.join(label))} fontsize=8")
    return " ".join(parts)


def to_dot(
    graph: Graph,
    *,
    saved: bool = True,
    attrs: bool = False,
    max_attr_chars: int = 50,
    clusters: bool = True,
    notes: dict[str, str] | None = None,
    legend: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> str:
    """Render ``graph`` as DOT text.

    Args:
        graph: the graph to draw.
        saved: draw each saved tensor as an orange box joined to its node.
        attrs: list each node's non-tensor saved attributes in its label.
        max_attr_chars: truncate attribute values to this many characters.
        clusters: when nodes carry module paths (``gs.scopes``), draw each module as a
            nested ``subgraph cluster_*`` labelled ``name: Class``; saved tensors and
            parameters then sit on the rank of their op, so modules stack compactly.
        notes: an extra label line per node id, e.g. ``Graph.memory().node_labels()``.
        legend: add a compact legend (what the colours, boxes and lines mean) under the graph,
            listing only what the picture uses.
        root: the model file's folder: forward lines are shown relative to it.

    Arrows point in the forward direction (input -> op), as torchviz draws them.

    Example:
        >>> from gradscope.graph.graph import Graph, Node
        >>> to_dot(Graph([Node("n0", "MulBackward0", "op")], roots=["n0"])).splitlines()[0]
        'digraph {'
    """
    # A cheap test first: graphs traced without scopes have no module and skip the grouping.
    cl = _cluster_keys(graph) if clusters and any(n.module for n in graph.nodes) else None
    clustered = cl is not None and any(cl.of.values())
    ids = _Ids(graph.nodes)
    opt = _Options(saved, attrs, max_attr_chars, notes, root, compact=clustered, ids=ids)
    # clustered pictures are tighter than torchviz's defaults: clusters add their own margins
    head = "\tgraph [rankdir=TB nodesep=0.12 ranksep=0.2]" if clustered else "\tgraph [rankdir=TB]"
    out = ["digraph {", f"\tnode [{NODE_ATTR}]", head]
    chains = param_chains(graph, cl.of) if clustered and cl is not None else {}
    # many labelled flat edges: their labels as xlabel (else Graphviz's ranker stalls)
    flat = flat_edges(chains) if len(chains) > XLABEL_CHAINS else set()
    if clustered and cl is not None:
        out.extend(_cluster_lines(graph, cl, opt, chains))
    else:
        _lines_into(out, graph.nodes, opt, "\t")
    tok, add = ids.tok.get, out.append
    for e in graph.edges:
        d, s = tok(e.dst), tok(e.src)
        # an edge to a node the graph lacks: ids.of names it too
        ends = ("\t" + d + " -> " + s if d is not None and s is not None
                else "\t" + ids.of(e.dst) + " -> " + ids.of(e.src))
        kind = e.kind
        if kind == "grad" and e.grad_norm is None and e.count == 1:  # the common edge
            add(ends)
        elif kind in ("view", "saved"):
            add(ends + " [style=dotted]")
        elif e.grad_norm is not None or e.count != 1:
            add(f"{ends} [{_edge_attrs(e, (e.src, e.dst) in flat)}]")
        else:
            add(ends)
    if legend:
        out.append(legend_line(graph, saved=saved, clustered=clustered))
    out.append("}")
    return "\n".join(out) + "\n"


#: The options of ``to_dot``, which every Graphviz-based format takes.
DOT_OPTIONS = frozenset(
    {"saved", "attrs", "max_attr_chars", "clusters", "notes", "legend", "root"}
)


def _render_dot(graph: Graph, **options: object) -> bytes:
    return to_dot(graph, **options).encode("utf-8")  # type: ignore[arg-type]


register_format(
    OutputFormat("dot", _render_dot, DOT_OPTIONS, "DOT text (no Graphviz needed)",
                 kind=FormatKind.PICTURE)  # a picture's source: the same bounded view
)
