"""The JSON form of a ``Graph`` (schema version 1), written by ``Graph.to_json`` and read back
by ``Graph.from_json``: ``Graph.from_json(g.to_json()) == g`` for every graph."""

from __future__ import annotations

import json
from typing import Any

from ..errors import SchemaError
from .graph import Edge, Graph, Node, SavedTensor, TensorInfo

SCHEMA_VERSION = 1


def graph_to_dict(g: Graph) -> dict[str, Any]:
    """The JSON-ready dict of schema version 1."""
    return {
        "gradscope": SCHEMA_VERSION,
        "roots": list(g.roots),
        "nodes": [_node_to_dict(n) for n in g.nodes],
        "edges": [_edge_to_dict(e) for e in g.edges],
    }


def graph_to_json(g: Graph) -> str:
    """JSON text (schema version 1), one node or edge per line for readable diffs."""
    d = graph_to_dict(g)
    dumps = json.dumps
    lines = ['{"gradscope": %d,' % SCHEMA_VERSION, ' "roots": %s,' % dumps(d["roots"])]
    for key, items, last in (("nodes", d["nodes"], False), ("edges", d["edges"], True)):
        end = "}" if last else ","
        if not items:
            lines.append(f' "{key}": []{end}')
            continue
        lines.append(f' "{key}": [')
        body = [f"  {dumps(item, ensure_ascii=False)}" for item in items]
        lines.append(",\n".join(body) + "]" + end)
    return "\n".join(lines) + "\n"


def graph_from_dict(d: Any) -> Graph:
    """Inverse of ``graph_to_dict``."""
    if not isinstance(d, dict) or d.get("gradscope") != SCHEMA_VERSION:
        raise SchemaError(
            'not a gradscope graph: expected a JSON object with "gradscope": 1 '
            "(write one with Graph.to_json() or gradscope render -o graph.json)"
        )
    try:
        nodes = [_node_from_dict(n) for n in d["nodes"]]
        edges = [
            Edge(
                e["src"],
                e["dst"],
                int(e.get("input_nr", 0)),
                e.get("kind", "grad"),
                None if e.get("grad_norm") is None else float(e["grad_norm"]),
                int(e.get("count", 1)),
            )
            for e in d["edges"]
        ]
        roots = list(d["roots"])
    except (KeyError, TypeError) as exc:
        raise SchemaError(f"malformed gradscope graph JSON: missing or bad field {exc}") from None
    return Graph(nodes=nodes, edges=edges, roots=roots)


def graph_from_json(s: str | bytes) -> Graph:
    """Parse JSON written by ``graph_to_json``."""
    try:
        data = json.loads(s)
    except json.JSONDecodeError as exc:
        raise SchemaError(
            f"not valid JSON ({exc}); expected the output of Graph.to_json()"
        ) from None
    return graph_from_dict(data)


def _float_to_json(x: float) -> float | str:
    """Strict JSON has no NaN/Infinity: write them as the strings "nan", "inf", "-inf"."""
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return x



def _saved_to_dict(s: SavedTensor) -> dict[str, Any]:
    return {
        "name": s.name,
        "shape": s.shape,
        "dtype": s.dtype,
        "device": s.device,
        "nbytes": s.nbytes,
        "storage": s.storage,
        "freed": s.freed,
    } | ({"storage_nbytes": s.storage_nbytes} if s.storage_nbytes != s.nbytes else {})


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
    d = {
        "id": n.id,
        "name": n.name,
        "kind": n.kind,
        "module": n.module,
        "attrs": n.attrs,
        "saved": [_saved_to_dict(s) for s in n.saved],
        "tensor": _tensor_to_dict(n.tensor),
    }
    if n.order is not None:  # optional keys appear only on annotated graphs
        d["order"] = n.order
    return d


def _edge_to_dict(e: Edge) -> dict[str, Any]:
    d: dict[str, Any] = {"src": e.src, "dst": e.dst, "input_nr": e.input_nr}
    if e.kind != "grad":
        d["kind"] = e.kind
    if e.grad_norm is not None:
        d["grad_norm"] = _float_to_json(e.grad_norm)
    if e.count != 1:
        d["count"] = e.count
    return d


def _node_from_dict(d: dict[str, Any]) -> Node:
    t = d.get("tensor")
    tensor = (
        TensorInfo(t["name"], list(t["shape"]), t["dtype"], t["device"], t.get("storage"))
        if t is not None
        else None
    )
    saved = [
        SavedTensor(
            s["name"],
            list(s["shape"]) if s["shape"] is not None else None,
            s["dtype"],
            s["device"],
            int(s["nbytes"]),
            s["storage"],
            bool(s["freed"]),
            s.get("storage_nbytes"),
        )
        for s in d.get("saved", [])
    ]
    return Node(
        id=d["id"],
        name=d["name"],
        kind=d["kind"],
        module=d.get("module"),
        attrs={str(k): str(v) for k, v in d.get("attrs", {}).items()},
        saved=saved,
        tensor=tensor,
        order=None if d.get("order") is None else int(d["order"]),
    )
