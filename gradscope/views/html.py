"""An interactive, self-contained HTML view of a ``Graph``: one file that works offline.

The page embeds the graph as JSON, the vendored ``dagre`` layout library (``_assets/``, see its
README for version and license) and a small viewer script: pan (drag) and zoom (wheel), search by
node name or module path, click a node for its details (kind, module, shapes, saved tensors with
bytes, attributes), click a collapsed module box to expand it and a cluster's title to collapse
it. Layout runs in the page, so expanding a module lays the graph out again. Nothing in the page
refers to anything outside it: it makes no network request.
"""

from __future__ import annotations

import html
import json
from functools import cache
from pathlib import Path
from typing import Any

from ..model.formats import OutputFormat, register_format
from ..model.graph import Graph, Node, SavedTensor, format_bytes
from ..model.nodes import saved_bytes_of
from ..model.paths import levels, module_class, node_paths
from ..model.transforms import auto_depth

ASSETS = Path(__file__).resolve().parent / "assets"


@cache
def _asset(name: str) -> str:
    text = (ASSETS / name).read_text(encoding="utf-8")
    # A source-map comment would make devtools fetch a file that is not there: drop it.
    lines = [ln for ln in text.splitlines() if not ln.startswith("//# sourceMappingURL=")]
    text = "\n".join(lines)
    # Inlined scripts must not contain their own end tag.
    return text.replace("</script", "<\\/script") if name.endswith(".js") else text


def _cluster_key(node: Node, path: str | None) -> list[str]:
    """Module levels of the cluster the node is drawn in (a module box sits in its parent)."""
    lv = levels(path) if path else []
    return lv[:-1] if lv and node.kind == "module" else lv


def _saved(s: SavedTensor) -> dict[str, Any]:
    return {"name": s.name, "shape": s.shape, "dtype": s.dtype, "nbytes": s.nbytes,
            "storage": s.storage, "freed": s.freed}


def _node_data(node: Node, key: str) -> dict[str, Any]:
    t = node.tensor
    return {
        "id": node.id,
        "name": node.name,
        "kind": node.kind,
        "module": node.module,
        "key": key,
        "attrs": node.attrs,
        "saved": [_saved(s) for s in node.saved],
        "tensor": None if t is None else {"name": t.name, "shape": t.shape, "dtype": t.dtype,
                                          "device": t.device},
        "bytes": node.saved_bytes,
        "order": node.order,
        "created_at": node.created_at,
        "nonfinite": node.nonfinite,
        "first_nonfinite": node.first_nonfinite,
        "view_base": node.view_base,
        "box": None if node.box is None else {
            "cls": node.box.cls, "nodes": node.box.nodes, "saved_bytes": node.box.saved_bytes,
            "repeat": node.box.repeat,
        },
    }


def _modules(graph: Graph, keys: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Every cluster path: its label, class, parent, node count and deduplicated saved bytes."""
    members: dict[str, list[Node]] = {}
    for node in graph.nodes:
        lv = keys[node.id]
        for d in range(1, len(lv) + 1):
            members.setdefault(".".join(lv[:d]), []).append(node)
    out: dict[str, dict[str, Any]] = {}
    for key, group in members.items():
        lv = levels(key)
        out[key] = {
            "label": lv[-1],
            "cls": module_class(key, group),
            "parent": ".".join(lv[:-1]),
            "depth": len(lv),
            "nodes": sum(n.count for n in group),
            "bytes": saved_bytes_of(group),
        }
    return out


def graph_data(graph: Graph, *, depth: int | None = None, max_nodes: int = 1500) -> dict[str, Any]:
    """The JSON the page embeds: nodes, edges, modules and which modules start expanded."""
    paths = node_paths(graph)
    keys = {n.id: _cluster_key(n, paths[n.id]) for n in graph.nodes}
    modules = _modules(graph, keys)
    if depth is None:
        depth = auto_depth(graph, max_nodes)
    expanded = [k for k, m in modules.items() if depth is None or m["depth"] < depth]
    return {
        "nodes": [_node_data(n, ".".join(keys[n.id])) for n in graph.nodes],
        "edges": [[e.src, e.dst, e.kind, e.count, e.input_nr] for e in graph.edges],
        "roots": graph.roots,
        "modules": modules,
        "expanded": expanded,
        "summary": graph.summary(),
        "total_bytes": graph.saved_bytes(),
        "total_bytes_text": format_bytes(graph.saved_bytes()),
    }


def to_html(
    graph: Graph, *, title: str = "gradscope graph", depth: int | None = None, max_nodes: int = 300
) -> str:
    """One self-contained HTML page showing ``graph`` interactively (works offline).

    Args:
        graph: the graph; module paths (``gs.scopes``) give it collapsible clusters.
        title: the page title.
        depth: modules deeper than this start collapsed; default: the deepest depth whose view
            has at most ``max_nodes`` nodes (everything expanded when the graph fits).
        max_nodes: the node budget of the first view when ``depth`` is not given (the page
            lays the graph out itself, which takes seconds per thousand nodes, so the budget is
            smaller than Graphviz's).

    Returns:
        The page as a string; write it to a ``.html`` file (``Graph.save("g.html")``).

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.ones(2, requires_grad=True)
        >>> page = gs.trace((x * 2).sum(), params={"x": x}).to_html()
        >>> page.startswith("<!DOCTYPE html>") and "MulBackward0" in page
        True
    """
    data = json.dumps(graph_data(graph, depth=depth, max_nodes=max_nodes), separators=(",", ":"))
    data = data.replace("<", "\\u003c")  # no "</script>" can end the data block early
    page = _asset("viewer.html")
    return (
        page.replace("{{TITLE}}", html.escape(title))
        .replace("/*{{DAGRE}}*/", _asset("dagre.min.js"))
        .replace("/*{{VIEWER}}*/", _asset("viewer.js"))
        .replace("{{DATA}}", data)
    )


def _render_html(graph: Graph, **options: Any) -> bytes:
    return to_html(graph, **options).encode("utf-8")


register_format(
    OutputFormat(
        "html",
        _render_html,
        frozenset({"title", "depth", "max_nodes"}),
        "interactive page, self-contained and offline",
    )
)
