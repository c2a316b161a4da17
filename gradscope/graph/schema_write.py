"""Writing a ``Graph`` as JSON (``Graph.to_json``), and the schema's constants and tables that
the reader (``gradscope.graph.schema``, where the format is described) and the HTML page share:
the version, what a node id may be, the edge, non-finite and alias kinds, and ``NODE_OPTIONAL``,
the one table of a node's optional keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ..output.envelope import KINDS, json_float
from .nodes import (
    Box,
    Edge,
    GraphLike,
    Node,
    Region,
    SavedTensor,
    TensorInfo,
)

SCHEMA_VERSION = KINDS["graph"]
#: Versions ``graph_from_dict`` reads (1 to 3 came before the envelope: no ``"kind"``).
READABLE_VERSIONS = (1, 2, 3, 4)
#: The deepest nesting a valid document has is 5 (a saved tensor's shape). A much deeper one
#: is refused by the JSON parser itself (its recursion guard), not by a scan of the text first.
MAX_DEPTH = 5
#: The largest integer a document may hold (sizes, counts, byte figures): a 64-bit count. A
#: larger one (``10**400``) is refused on load: no view could do arithmetic with it.
MAX_INT = 2**63 - 1
#: What a node id may be: letters, digits, ``_``, ``-`` and ``.``, at most 200 characters
#: (``n0``, ``m3``, ``more``), so an id is a name in every output, never syntax of it.
NODE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")
EDGE_KINDS = ("grad", "view", "saved")
NONFINITE_KINDS = ("nan", "inf")
ALIAS_KINDS = ("leaf", "output")


# ---------------------------------------------------------------------------- writing
def graph_to_dict(g: GraphLike) -> dict[str, Any]:
    """The JSON-ready dict of the current schema version."""
    return {
        "gradscope": SCHEMA_VERSION,
        "kind": "graph",
        "roots": list(g.roots),
        "nodes": [_node_to_dict(n) for n in g.nodes],
        "edges": [_edge_to_dict(e) for e in g.edges],
    }


def graph_to_json(g: GraphLike) -> str:
    """JSON text, one node or edge per line for readable diffs; strict JSON (no NaN)."""
    d = graph_to_dict(g)
    dumps = json.dumps
    lines = ['{"gradscope": %d, "kind": "graph",' % SCHEMA_VERSION,
             ' "roots": %s,' % dumps(d["roots"])]
    for key, items, last in (("nodes", d["nodes"], False), ("edges", d["edges"], True)):
        end = "}" if last else ","
        if not items:
            lines.append(f' "{key}": []{end}')
            continue
        lines.append(f' "{key}": [')
        body = [f"  {dumps(item, ensure_ascii=False, allow_nan=False)}" for item in items]
        lines.append(",\n".join(body) + "]" + end)
    text = "\n".join(lines) + "\n"
    # A lone surrogate (a name decoded with surrogateescape...) cannot be written as UTF-8:
    # it is written as its JSON escape, which reads back as the same string.
    if not text.isascii() and _SURROGATE.search(text):
        text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text


#: A float for strict JSON (NaN/Inf as "nan", "inf", "-inf"): the envelope's one encoding.
float_to_json = json_float


def _saved_to_dict(s: SavedTensor) -> dict[str, Any]:
    return {
        "name": s.name,
        "shape": s.shape,
        "dtype": s.dtype,
        "device": s.device,
        "nbytes": s.nbytes,
        "storage": s.storage,
        "freed": s.freed,
    } | ({"storage_nbytes": s.storage_nbytes} if s.storage_nbytes != s.nbytes else {}) | (
        {"alias": s.alias} if s.alias is not None else {})


def _tensor_to_dict(t: TensorInfo | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {
        "name": t.name,
        "shape": t.shape,
        "dtype": t.dtype,
        "device": t.device,
        "storage": t.storage,
    }


def _node_to_dict(n: Node) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": n.id,
        "name": n.name,
        "kind": n.kind,
        "module": n.module,
        "attrs": n.attrs,
        "saved": [_saved_to_dict(s) for s in n.saved],
        "tensor": _tensor_to_dict(n.tensor),
    }
    # optional keys appear only when set, so plain graphs keep short lines
    for key, to_json in NODE_OPTIONAL.items():
        value = getattr(n, key)
        if value is not None and value is not False:
            d[key] = to_json(value)
    return d


def _box_to_dict(b: Box) -> dict[str, Any]:
    box: dict[str, Any] = {"cls": b.cls, "nodes": b.nodes, "saved_bytes": b.saved_bytes}
    if b.repeat is not None:
        box["repeat"] = b.repeat
    if b.leaf_bytes:
        box["leaf_bytes"] = b.leaf_bytes
    if b.output_bytes:
        box["output_bytes"] = b.output_bytes
    if b.aliases:
        box["aliases"] = dict(b.aliases)
    if b.shown is not None:
        box["shown"] = b.shown
    return box


def _region_to_dict(r: Region) -> dict[str, Any]:
    return {"graph": r.graph, "ops": r.ops, "note": r.note}


def _same(value: Any) -> Any:
    return value


#: A node's optional keys, in the order ``Graph.to_json`` writes them: each is the ``Node``
#: attribute of the same name, written in the JSON form this gives, and only when it is set (not
#: None, not False). The one table of them: the HTML page names its node info by these keys and
#: shows a key it has no code for as it is (``views.page_data.INFO``).
NODE_OPTIONAL: dict[str, Callable[[Any], Any]] = {
    "order": _same,
    "module_classes": list,
    "created_at": _same,
    "nonfinite": _same,
    "first_nonfinite": _same,
    "view_base": _same,
    "forward_nonfinite": _same,
    "box": _box_to_dict,
    "region": _same,
    "compiled": _region_to_dict,
}


def _edge_to_dict(e: Edge) -> dict[str, Any]:
    d: dict[str, Any] = {"src": e.src, "dst": e.dst, "input_nr": e.input_nr}
    if e.kind != "grad":
        d["kind"] = e.kind
    if e.grad_norm is not None:
        d["grad_norm"] = float_to_json(e.grad_norm)
    if e.count != 1:
        d["count"] = e.count
    return d
