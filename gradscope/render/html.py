"""An interactive, self-contained HTML view of a ``Graph``: one file that works offline.

The page embeds the graph as compact JSON, the vendored ``dagre`` layout library (``_assets/``,
see its README for version and license) and the viewer script. The graph is shown as a tree of
*containers*: the model's modules (``gs.scopes``), runs of identical layers (``fold``: one
member drawn, the others summarised, any of them can be opened) and, where a container holds
more direct items than one layout should see (a 20,000-op chain with no modules), consecutive
*chunks* of it in forward order. The page lays out one container's direct contents at a time,
in a Web Worker, when the container is first opened (a child is a box of known size), so no
layout call sees more than ``CHUNK`` items, and it draws on a canvas, culled to the viewport.
Nothing in the page refers to anything outside it: it makes no network request.

The page exposes ``window.gradscope`` (see the README): ``ready``, ``visible()``,
``expand(path)``, ``collapse(path)``, ``expandAll()``, ``search(text)``, ``select(id)``,
``details()``, ``firstNonfinite()``.

Three modules make it: ``views.containers`` (the tree of containers), ``views.page_data`` (the
page's rows, their fields named once in ``FIELDS``) and this one (the page itself: the template
filled once, the data in blocks, the notebook frame).
"""

from __future__ import annotations

import html
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from ..doctor.findings import DoctorReport
from ..graph.graph import Graph
from ..graph.schema_write import float_to_json
from ..numerics.records import DivergenceMarks
from ..output.formats import (
    FormatKind,
    OutputFormat,
    register_format,
    register_renderer,
)
from ..output.style import clean_text
from .containers import CHUNK, MAX_LEVELS
from .page_data import (
    BUDGET,
    DEFAULTS,
    FIELDS,
    GRAPHVIZ_HEX,
    PAGE_COLORS,
    DiffMarks,
    graph_data,
)
from .page_wire import PART, encode

__all__ = [
    "BUDGET", "CHUNK", "DEFAULTS", "FIELDS", "GRAPHVIZ_HEX", "MAX_LEVELS", "PAGE_COLORS", "PART",
    "DiffMarks", "float_to_json", "graph_data", "notebook_height", "to_html", "to_notebook_html",
]

ASSETS = Path(__file__).resolve().parent / "assets"



@cache
def _asset(name: str) -> str:
    text = (ASSETS / name).read_text(encoding="utf-8")
    # A source-map comment would make devtools fetch a file that is not there: drop it.
    lines = [ln for ln in text.splitlines() if not ln.startswith("//# sourceMappingURL=")]
    text = "\n".join(lines)
    # Inlined scripts must not contain their own end tag.
    return text.replace("</script", "<\\/script") if name.endswith(".js") else text


def to_html(
    graph: Graph,
    *,
    title: str = "gradscope graph",
    depth: int | None = None,
    full: bool = False,
    fold: bool = True,
    saved: bool = True,
    notes: dict[str, str] | None = None,
    root: str | Path | None = None,
    max_nodes: int = BUDGET,
    diff: DiffMarks | None = None,
    doctor: DoctorReport | None = None,
    numerics: DivergenceMarks | None = None,
) -> str:
    """One self-contained HTML page showing ``graph`` interactively (works offline).

    Args:
        graph: the graph; module paths (``gs.scopes``) give it collapsible clusters.
        title: the page title.
        depth: modules at this depth and deeper start collapsed.
        full: start with every module open and every repeat unfolded.
        fold: show runs of identical layers as one drawn member and a summary (each can be
            opened in the page); False draws every member.
        saved: start with saved tensors drawn as orange boxes (a toggle in the page).
        notes: an extra label line per node id, e.g. ``{"n3": "holds 2.0 KiB"}`` (``--memory``).
        root: the model file's folder: forward-line locations are shown relative to it.
        max_nodes: without ``depth`` or ``full``, open modules breadth-first while the first
            view has at most this many boxes.
        diff: a diff page's marks and norm ratios (``views.diff.diff_page`` fills it).
        doctor: ``gs.doctor``'s report on the step that made ``graph`` (``Doctor.trace``): each
            finding's nodes are highlighted, its message shown, a button goes to it; a report
            without findings is said so.
        numerics: a divergence drawn on this graph (``gs.trace_divergence`` makes it): each
            node coloured by its error against the reference run on the one scale, the
            numbers in its details, the first divergence marked, revealed and shown first.

    Returns:
        The page as a string; write it to a ``.html`` file (``Graph.save("g.html")``).

    Example:
        >>> from gradscope.graph.graph import Graph, Node
        >>> page = to_html(Graph([Node("n0", "MulBackward0", "op")], roots=["n0"]))
        >>> page.startswith("<!DOCTYPE html>") and "MulBackward0" in page
        True
    """
    data = graph_data(graph, depth=depth, full=full, fold=fold, saved=saved, notes=notes,
                      root=root, budget=max_nodes, diff=diff, doctor=doctor,
                      numerics=numerics)
    # Nodes and edges go in blocks of PART rows as columns, with their names and infos in
    # tables of their own (views.page_wire), each block parsed in its own task by the page, so
    # no single JSON.parse of a 100,000-node graph holds the main thread.
    nodes, edges = data.pop("nodes"), data.pop("edges")
    data["n_nodes"], data["n_edges"] = len(nodes), len(edges)
    parts = [f'<script type="application/json" class="gs-part" data-kind="{kind}">'
             f"{_json(block)}</script>" for kind, block in encode(nodes, edges)]
    fill = {
        "{{TITLE}}": html.escape(clean_text(title)),
        "/*{{DAGRE}}*/": _asset("dagre.min.js"),
        "/*{{LAYOUT}}*/": _asset("layout.js"),
        "/*{{VIEWER}}*/": _asset("viewer.js"),
        "{{DATA}}": _json(data),
        "<!--{{PARTS}}-->": "\n".join(parts),
    }
    # One pass over the template: what is filled in (a title, the graph's names) is never
    # searched for placeholders again, so "{{DATA}}" in a title stays those eight characters.
    return _PLACEHOLDER.sub(lambda m: fill[m.group()], _asset("viewer.html"))


_PLACEHOLDER = re.compile(r"\{\{TITLE\}\}|/\*\{\{(?:DAGRE|LAYOUT|VIEWER)\}\}\*/|\{\{DATA\}\}"
                          r"|<!--\{\{PARTS\}\}-->")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _json(value: Any) -> str:
    """JSON for a ``<script type="application/json">`` block: ``<`` written ``\\u003c`` (no
    ``</script>`` or ``<!--`` can end or change the block), lone surrogates as their escapes
    (the page reads back the same string; UTF-8 cannot hold them)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if not text.isascii() and _SURROGATE.search(text):
        text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text.replace("<", "\\u003c")


def to_notebook_html(graph: Graph, *, height: int | None = None, **options: Any) -> str:
    """The page in a sandboxed ``<iframe srcdoc>`` for notebooks (``Graph._repr_html_``): its
    scripts run in their own document and it stays self-contained. The frame is as tall as the
    graph's first view needs (``notebook_height``) unless ``height`` is given; inside a frame the
    page starts with its side panel folded (a click on a node opens it, narrow)."""
    page = to_html(graph, **options)
    tall = notebook_height(graph) if height is None else int(height)
    # single quotes around srcdoc: the page's JSON is full of double quotes, which would each
    # become a 6-byte &quot; (a third of the page again); it has few single quotes
    srcdoc = page.replace("&", "&amp;").replace("'", "&#39;")
    return (
        f"<iframe sandbox=\"allow-scripts allow-downloads\" srcdoc='{srcdoc}'"
        f' style="width:100%;height:{tall}px;border:1px solid #ccc"'
        ' title="gradscope graph"></iframe>'
    )


#: A notebook frame's height: header and footer, then about this many pixels per rank of boxes
#: at a legible scale, between the two bounds.
_FRAME_CHROME, _FRAME_RANK, _FRAME_MIN, _FRAME_MAX = 110, 52, 260, 640


def notebook_height(graph: Graph) -> int:
    """Pixels a notebook frame needs to show ``graph`` at a legible scale: its longest path
    (ranks of boxes, top to bottom) times the height of a rank, within 260-640 px (a taller
    graph opens at its top, the minimap shows the rest)."""
    index = {n.id: i for i, n in enumerate(graph.nodes)}
    ranks = [1] * len(graph.nodes)
    indeg = [0] * len(graph.nodes)
    succ: list[list[int]] = [[] for _ in graph.nodes]
    for e in graph.edges:
        a, b = index.get(e.src), index.get(e.dst)
        if a is None or b is None or a == b:
            continue
        succ[a].append(b)
        indeg[b] += 1
    todo = [i for i, d in enumerate(indeg) if d == 0]
    longest = 1
    while todo:
        i = todo.pop()
        longest = max(longest, ranks[i])
        if longest * _FRAME_RANK + _FRAME_CHROME >= _FRAME_MAX:
            return _FRAME_MAX
        for j in succ[i]:
            ranks[j] = max(ranks[j], ranks[i] + 1)
            indeg[j] -= 1
            if indeg[j] == 0:
                todo.append(j)
    return max(_FRAME_MIN, min(_FRAME_MAX, _FRAME_CHROME + _FRAME_RANK * longest))


def _render_html(graph: Graph, **options: Any) -> bytes:
    return to_html(graph, **options).encode("utf-8")


#: What ``to_html`` takes; the CLI passes ``saved`` and ``notes`` to every format.
HTML_OPTIONS = frozenset({"title", "depth", "full", "fold", "saved", "notes", "root", "max_nodes",
                          "doctor", "numerics"})

register_format(
    OutputFormat("html", _render_html, HTML_OPTIONS, "interactive page, self-contained and offline",
                 kind=FormatKind.PAGE)
)
register_renderer("notebook_html", to_notebook_html)
register_renderer("numerics_html", to_html)  # DivergenceGraph.to_html
