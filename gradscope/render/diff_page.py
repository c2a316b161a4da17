"""The page of a diff of two graphs (``gradscope diff A.json B.json -o diff.html``): the union
graph (``model.diff.union``: every node of b and what was removed from a) in the HTML viewer,
added nodes green, removed red, changed yellow, and each edge found in both labelled with the
ratio of its gradient norm (b / a) where both graphs carry norms (``--backward``)."""

from __future__ import annotations

from typing import Any

from ..graph.diff import GraphDiff, diff, union
from ..graph.graph import Graph
from ..output.formats import register_renderer
from ..output.style import MAX_SHOWN, terminal_text
from .html import DiffMarks, to_html


def diff_page(a: Graph, b: Graph, d: GraphDiff | None = None, *, title: str = "gradscope diff",
              **options: Any) -> str:
    """One self-contained page showing what changed from ``a`` to ``b`` (``to_html``'s options
    apply: ``depth``, ``full``, ``max_nodes``...)."""
    d = diff(a, b) if d is None else d
    nodes, edges, roots, marks = union(a, b, d)
    where = {(e.src, e.dst, e.input_nr): k for k, e in enumerate(b.edges)}
    ratios = {where[(r.src, r.dst, r.input_nr)]: r.ratio for r in d.ratios
              if (r.src, r.dst, r.input_nr) in where}
    g = Graph(nodes=nodes, edges=edges, roots=roots)
    changed = {k: "added" for k in d.added_edges}  # b's edges come first in the union
    changed |= {len(b.edges) + n: "removed" for n in range(len(d.removed_edges))}
    return to_html(g, title=title, diff=DiffMarks(marks, ratios, d.summary(), changed), **options)


def diff_text(d: GraphDiff, *, labels: tuple[str, str] | None = None, limit: int = 40) -> str:
    """The terminal listing of a diff: ``a: LABEL: Graph(...)`` and ``b: ...`` when ``labels``
    are given, the summary, then one line per node added (``+``), removed (``-``) or changed
    (``~``), at most ``limit`` of them. Names come from the graphs' files: every line is data,
    its control characters written as visible escapes and a very long one cut
    (``terminal_text``)."""
    lines = []
    if labels is not None:
        lines += [f"a: {terminal_text(labels[0])}: {d.a!r}",
                  f"b: {terminal_text(labels[1])}: {d.b!r}"]
    lines.append(d.summary())
    items = (
        [("+", d.keys["b:" + i]) for i in d.added]
        + [("-", d.keys["a:" + i]) for i in d.removed]
        + [("~", f"{terminal_text(c.key)}: {terminal_text(c.describe())}") for c in d.changed]
    )
    lines += [f"  {mark} {terminal_text(text)}" for mark, text in items[:limit]]
    if len(items) > limit:
        lines.append(f"  ... and {len(items) - limit} more")
    return "\n".join(terminal_text(line, limit=4 * MAX_SHOWN) for line in lines)


register_renderer("diff_html", diff_page)
register_renderer("diff_text", diff_text)
