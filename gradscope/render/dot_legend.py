"""The compact DOT legend (``to_dot(..., legend=True)``): an HTML-like table under the graph
listing only what the picture uses."""

from __future__ import annotations

import math

from ..graph.graph import Graph
from ..output.style import (
    BAD_COLOR,
    BASE_COLOR,
    CUSTOM_COLOR,
    FOLDED_COLOR,
    LEAF_COLOR,
    MODULE_COLOR,
    NORM_BANDS,
    OUTPUT_COLOR,
    SAVED_COLOR,
)
from .dot_nodes import OP_COLOR


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def legend_line(graph: Graph, *, saved: bool = True, clustered: bool = False) -> str:
    """The compact legend, as a DOT graph label (an HTML-like table under the graph) listing
    only what this picture uses: node kinds, saved tensors, module frames and boxes, folds,
    view-base edges, merged-edge counts and, when the graph has gradient norms, their scale."""
    kinds = {n.kind for n in graph.nodes}
    cells: list[tuple[str, str]] = []  # (fill colour, text)
    if kinds & {"op", "accumulate"}:
        cells.append((OP_COLOR, "op"))
    if "custom" in kinds:
        cells.append((CUSTOM_COLOR, "custom Function"))
    if "leaf" in kinds:
        cells.append((LEAF_COLOR, "leaf (parameter, input)"))
    if "output" in kinds:
        cells.append((OUTPUT_COLOR, "output"))
    if any(n.view_base for n in graph.nodes):
        cells.append((BASE_COLOR, "view base"))
    if saved and any(n.saved and n.kind != "module" for n in graph.nodes):
        cells.append((SAVED_COLOR, "saved tensor"))
    boxes = [n for n in graph.nodes if n.kind == "module"]
    if any(b.box is None or not b.box.repeat for b in boxes):
        cells.append((MODULE_COLOR, "collapsed module"))
    if any(b.box is not None and b.box.repeat for b in boxes):
        cells.append((FOLDED_COLOR, "repeated layers"))
    if any(n.nonfinite for n in graph.nodes):
        cells.append((BAD_COLOR, "first NaN/Inf"))
    notes = []
    if clustered:
        notes.append("dashed frame: module")
    if any(e.kind == "view" for e in graph.edges):
        notes.append("dotted: view → base")
    if any(e.count != 1 for e in graph.edges):
        notes.append("xN: N edges merged")
    if any(n.order is not None for n in graph.nodes):
        notes.append("#N: backward order")
    rows = []
    if cells:
        swatches = "".join(
            f'<TD BGCOLOR="{c}" BORDER="1" WIDTH="12" HEIGHT="9" FIXEDSIZE="TRUE"></TD>'
            f'<TD ALIGN="LEFT">{_html(t)}  </TD>'
            for c, t in cells
        )
        rows.append(f'<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="1" CELLPADDING="1">'
                    f"<TR>{swatches}</TR></TABLE>")
    if any(e.grad_norm is not None for e in graph.edges):
        bands = "  ".join(
            f'<FONT COLOR="{b.color}">{_html(b.name + _band_range(i))}</FONT>'
            for i, b in enumerate(NORM_BANDS)
        )
        bad = f'<FONT COLOR="{BAD_COLOR}">NaN/Inf</FONT>'
        rows.append(f"edge colour, gradient norm: {bands}  {bad}")
    if notes:
        rows.append(_html("  ·  ".join(notes)))
    if not rows:
        return ""
    body = "".join(f'<TR><TD ALIGN="LEFT">{r}</TD></TR>' for r in rows)
    table = f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">{body}</TABLE>>'
    return f"\tgraph [label={table} labelloc=b labeljust=l fontsize=9 fontname=monospace]"


def _band_range(i: int) -> str:
    lower = NORM_BANDS[i - 1].upper if i else None
    upper = NORM_BANDS[i].upper
    if lower is None:
        return f" <{upper:g}"
    if math.isinf(upper):
        return f" ≥{lower:g}"
    return f" {lower:g}–{upper:g}"
