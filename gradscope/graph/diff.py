"""What changed between two graphs: ``gs.diff(a, b) -> GraphDiff`` (plain data, no torch).

Node ids are walk positions, so they shift as soon as one layer is added: nodes are matched by
what they are instead, their *key*: module path, op name and order among the nodes of that
module with that name (in walk order), e.g. ``encoder.layers.3/AddmmBackward0#1``. A leaf is
keyed by its name (``0.weight``), an AccumulateGrad by the leaf it feeds. Edges are matched by
the keys of their two ends and their input slot. A matched node whose tensor (shape, dtype),
saved tensors (names, shapes, dtypes) or saved bytes differ is *changed*; where both edges of a
matched pair carry a gradient norm (``--backward``), their ratio ``b / a`` is reported.

Example (``gs.diff`` is this function; ids differ, the match does not use them):
    >>> from gradscope.graph.graph import Edge, Graph, Node
    >>> a = Graph([Node("n0", "SumBackward0", "op"), Node("n1", "MulBackward0", "op")],
    ...           [Edge("n0", "n1")], ["n0"])
    >>> b = Graph([Node("n0", "SumBackward0", "op"), Node("n1", "ExpBackward0", "op"),
    ...            Node("n2", "MulBackward0", "op")],
    ...           [Edge("n0", "n1"), Edge("n1", "n2")], ["n0"])
    >>> d = diff(a, b)
    >>> [b.node(i).name for i in d.added], d.removed, d.changed, d.matched
    (['ExpBackward0'], [], [], {'n0': 'n0', 'n1': 'n2'})
    >>> diff(a, a).empty
    True
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..output.envelope import json_float
from ..output.files import write_atomic
from .nodes import (
    Edge,
    GraphLike,
    Node,
    format_bytes,
    plural,
    saved_bytes_of,
)


@dataclass
class NodeChange:
    """A node found in both graphs whose tensors differ: ``fields`` maps what changed
    (``shape``, ``dtype``, ``saved``, ``saved bytes``) to its text in ``a`` and in ``b``."""

    key: str
    a: str  # the node's id in graph a
    b: str  # its id in graph b
    name: str
    fields: dict[str, tuple[str, str]] = field(default_factory=dict)

    def describe(self) -> str:
        """``shape (4, 8) -> (4, 16); saved bytes 128 B -> 256 B``."""
        return "; ".join(f"{k} {old} -> {new}" for k, (old, new) in self.fields.items())


@dataclass
class EdgeRatio:
    """The gradient norm along an edge found in both graphs: ``ratio = b / a`` (``inf`` where
    a's norm is 0 and b's is not, 1.0 where both are 0, ``nan`` where either is non-finite)."""

    src: str  # edge ends, as node ids in graph b
    dst: str
    input_nr: int
    a_norm: float
    b_norm: float
    ratio: float


@dataclass
class GraphDiff:
    """Nodes added in ``b``, removed from ``a``, changed between them, and the ratio of the
    gradient norm along each edge found in both (when both carry norms)."""

    added: list[str] = field(default_factory=list)  # node ids in b
    removed: list[str] = field(default_factory=list)  # node ids in a
    changed: list[NodeChange] = field(default_factory=list)
    matched: dict[str, str] = field(default_factory=dict)  # id in a -> id in b
    added_edges: list[int] = field(default_factory=list)  # indices into b.edges
    removed_edges: list[int] = field(default_factory=list)  # indices into a.edges
    ratios: list[EdgeRatio] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)  # "a:<id>" / "b:<id>" -> the node's key
    a: GraphLike | None = field(default=None, repr=False, compare=False)  # the graphs compared
    b: GraphLike | None = field(default=None, repr=False, compare=False)

    def to_html(self, **options: Any) -> str:
        """The diff page (``gradscope.render.diff_page.diff_page``): the union graph in the viewer,
        added nodes green, removed red, changed yellow, norm ratios on the edges."""
        from ..output.formats import renderer

        return str(renderer("diff_html")(self.a, self.b, self, **options))

    def to_text(self, *, labels: tuple[str, str] | None = None, limit: int = 40) -> str:
        """The terminal listing (``gradscope.render.diff_page.diff_text``): the summary and one line
        per node added, removed or changed (at most ``limit``), names written as data."""
        from ..output.formats import renderer

        return str(renderer("diff_text")(self, labels=labels, limit=limit))

    def save(self, path: str | Path, **options: Any) -> Path:
        """Write the diff page atomically (``to_html``'s options).

        Raises:
            OutputError: the file could not be written (the previous one is unchanged).
        """
        return write_atomic(path, self.to_html(**options))

    @property
    def empty(self) -> bool:
        """No node or edge added, removed or changed (norm ratios are not differences)."""
        return not (self.added or self.removed or self.changed or self.added_edges
                    or self.removed_edges)

    def summary(self) -> str:
        """One line: ``3 nodes added, 0 removed, 1 changed; 4 edges added, 0 removed``, and the
        largest norm ratio where there are any."""
        line = (f"{plural(len(self.added), 'node')} added, {len(self.removed)} removed, "
                f"{len(self.changed)} changed; {plural(len(self.added_edges), 'edge')} added, "
                f"{len(self.removed_edges)} removed")
        finite = [r for r in self.ratios if math.isfinite(r.ratio) and r.ratio > 0]
        if finite:
            worst = max(finite, key=lambda r: abs(math.log(r.ratio)))
            line += (f"; gradient norm ratio b/a on {plural(len(finite), 'edge')}, furthest "
                     "from 1: "
                     f"{worst.ratio:.3g} ({self.keys.get('b:' + worst.src, worst.src)} -> "
                     f"{self.keys.get('b:' + worst.dst, worst.dst)})")
        # the edges whose ratio is no number at all say more than any finite one
        bad = [(label, [r for r in self.ratios if test(r.ratio)]) for label, test in (
            ("NaN", lambda x: x != x), ("infinite", math.isinf), ("zero", lambda x: x == 0))]
        said = [f"{len(rs)} {label}" for label, rs in bad if rs]
        if said:
            first = next(rs[0] for _, rs in bad if rs)
            line += (f"; {', '.join(said)} of {plural(len(self.ratios), 'edge ratio')} (first: "
                     f"{self.keys.get('b:' + first.src, first.src)} -> "
                     f"{self.keys.get('b:' + first.dst, first.dst)})")
        return line

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the lists above, changes and ratios as objects."""
        num = json_float
        return {
            "added": self.added, "removed": self.removed,
            "changed": [{"key": c.key, "a": c.a, "b": c.b, "name": c.name,
                         "fields": {k: list(v) for k, v in c.fields.items()}}
                        for c in self.changed],
            "added_edges": self.added_edges, "removed_edges": self.removed_edges,
            "ratios": [{"src": r.src, "dst": r.dst, "input_nr": r.input_nr,
                        "a": num(r.a_norm), "b": num(r.b_norm), "ratio": num(r.ratio)}
                       for r in self.ratios],
        }


def node_keys(graph: GraphLike) -> dict[str, str]:
    """Each node's key (see the module docstring), unique within the graph."""
    leaf_of: dict[str, str] = {}
    kinds = {n.id: n for n in graph.nodes}
    for e in graph.edges:
        src, dst = kinds.get(e.src), kinds.get(e.dst)
        if src is not None and dst is not None and src.kind == "accumulate" and dst.kind == "leaf":
            leaf_of[src.id] = dst.name
    seen: dict[str, int] = defaultdict(int)
    out: dict[str, str] = {}
    for n in graph.nodes:
        if n.kind == "leaf" and n.name:
            base = f"leaf:{n.name}"
        elif n.kind == "accumulate" and n.id in leaf_of:
            base = f"AccumulateGrad({leaf_of[n.id]})"
        else:
            base = f"{n.module or ''}/{n.name}"
        k = seen[base]
        seen[base] += 1
        out[n.id] = f"{base}#{k}" if k else base
    return out


def _shape(shape: list[int | None] | None) -> str:
    if shape is None:
        return "?"
    return "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"


def _looks(n: Node) -> dict[str, str]:
    """What a node's tensors look like, as text to compare."""
    out: dict[str, str] = {}
    if n.tensor is not None:
        out["shape"] = _shape(n.tensor.shape)
        out["dtype"] = n.tensor.dtype
    if n.saved:
        out["saved"] = ", ".join(f"{s.name} {_shape(s.shape)} {s.dtype}" for s in n.saved)
        out["saved bytes"] = format_bytes(saved_bytes_of([n]))
    return out


def _ratio(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.nan
    if a == 0:
        return 1.0 if b == 0 else math.inf
    return b / a


def diff(a: GraphLike, b: GraphLike) -> GraphDiff:
    """What changed from graph ``a`` to graph ``b``: nodes matched by module path, op name and
    order within the module (not by id); see ``GraphDiff``.

    Example:
        >>> from gradscope.graph.graph import Graph, Node
        >>> g = Graph([Node("n0", "SumBackward0", "op")], [], ["n0"])
        >>> diff(g, g).summary()
        '0 nodes added, 0 removed, 0 changed; 0 edges added, 0 removed'
    """
    ka, kb = node_keys(a), node_keys(b)
    by_key_b = {k: nid for nid, k in kb.items()}
    by_key_a = {k: nid for nid, k in ka.items()}
    out = GraphDiff(a=a, b=b)
    out.keys = {"a:" + i: k for i, k in ka.items()} | {"b:" + i: k for i, k in kb.items()}
    nodes_b = {n.id: n for n in b.nodes}
    for n in a.nodes:
        other = by_key_b.get(ka[n.id])
        if other is None:
            out.removed.append(n.id)
            continue
        out.matched[n.id] = other
        before, after = _looks(n), _looks(nodes_b[other])
        fields = {k: (before.get(k, "-"), after.get(k, "-"))
                  for k in dict.fromkeys([*before, *after]) if before.get(k) != after.get(k)}
        if fields:
            out.changed.append(NodeChange(ka[n.id], n.id, other, n.name, fields))
    out.added = [n.id for n in b.nodes if kb[n.id] not in by_key_a]

    def edge_key(e: Edge, keys: dict[str, str]) -> tuple[str, str, int]:
        return keys.get(e.src, e.src), keys.get(e.dst, e.dst), e.input_nr

    edges_a: dict[tuple[str, str, int], Edge] = {}
    for e in a.edges:
        edges_a.setdefault(edge_key(e, ka), e)
    keys_b: set[tuple[str, str, int]] = set()
    for k, e in enumerate(b.edges):
        key = edge_key(e, kb)
        keys_b.add(key)
        old = edges_a.get(key)
        if old is None:
            out.added_edges.append(k)
        elif old.grad_norm is not None and e.grad_norm is not None:
            out.ratios.append(EdgeRatio(e.src, e.dst, e.input_nr, old.grad_norm, e.grad_norm,
                                        _ratio(old.grad_norm, e.grad_norm)))
    out.removed_edges = [k for k, e in enumerate(a.edges) if edge_key(e, ka) not in keys_b]
    return out


def union(a: GraphLike, b: GraphLike, d: GraphDiff) -> tuple[list[Node], list[Edge], list[str],
                                                               dict[str, str]]:
    """The union graph a diff page draws: every node and edge of ``b``, plus what was removed
    from ``a`` (ids prefixed ``a:``), and each node's mark (``added``, ``removed``,
    ``changed``). Returns (nodes, edges, roots, marks)."""
    from dataclasses import replace

    removed = set(d.removed)
    to_union = {nid: ("a:" + nid if nid in removed else d.matched[nid]) for nid in
                [n.id for n in a.nodes]}
    nodes = list(b.nodes) + [replace(n, id=to_union[n.id]) for n in a.nodes if n.id in removed]
    edges = list(b.edges) + [replace(a.edges[k], src=to_union[a.edges[k].src],
                                     dst=to_union[a.edges[k].dst]) for k in d.removed_edges]
    roots = list(b.roots) + [to_union[r] for r in a.roots if r in removed]
    marks = {nid: "added" for nid in d.added}
    marks |= {"a:" + nid: "removed" for nid in d.removed}
    marks |= {c.b: "changed" for c in d.changed}
    return nodes, edges, roots, marks
