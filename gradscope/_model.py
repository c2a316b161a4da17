"""The graph model: plain data, no torch objects.

Capture (``gradscope._capture``) fills these dataclasses from a live autograd graph; renderers
read them. Nothing here imports torch, so a ``Graph`` can be serialised, compared, and kept after
the autograd graph it describes is gone, without keeping any tensor alive.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._errors import GradscopeError

SCHEMA_VERSION = 1

#: Node kinds, in the vocabulary of the design document; ``module`` is a collapsed group of
#: nodes (``Graph.collapse``) and only appears in collapsed views.
KINDS = ("op", "custom", "accumulate", "leaf", "output", "module")


@dataclass(slots=True)
class SavedTensor:
    """A tensor saved by a backward node for use in backward.

    Attributes:
        name: the saved name without the ``_saved_`` prefix (``self``, ``mat1``, ``result``),
            ``name[i]`` for one element of a saved list, ``saved_tensors[i]`` for custom Functions.
        shape: the tensor's shape; None when backward already freed it and torch kept no size.
        dtype: e.g. ``float32``; None once freed.
        device: e.g. ``cpu`` or ``cuda:0``; None once freed.
        nbytes: ``numel * element_size`` of the saved tensor (0 once freed).
        storage: an id (``s0``, ``s1``...) shared by every tensor in the graph on the same storage.
        freed: True once backward released the tensor (``retain_graph=False``).
        storage_nbytes: bytes of the whole storage behind it (a saved slice keeps all of it
            alive); defaults to ``nbytes``.
    """

    name: str
    shape: list[int] | None
    dtype: str | None
    device: str | None
    nbytes: int
    storage: str | None
    freed: bool = False
    storage_nbytes: int | None = None

    def __post_init__(self) -> None:
        if self.storage_nbytes is None:
            self.storage_nbytes = self.nbytes


@dataclass(slots=True)
class TensorInfo:
    """The tensor behind a ``leaf`` or ``output`` node."""

    name: str | None
    shape: list[int]
    dtype: str
    device: str
    storage: str | None = None


@dataclass(slots=True)
class Node:
    """One node of the autograd graph (or a tensor drawn next to it).

    Attributes:
        id: stable id (``n0``, ``n1``...) assigned in walk order.
        name: the backward node's class name (``MulBackward0``, ``AccumulateGrad``,
            ``MyFunctionBackward``); for ``leaf`` and ``output`` nodes the tensor's name or "".
        kind: one of ``op``, ``custom``, ``accumulate``, ``leaf``, ``output``.
        module: dotted path of the module whose forward created the node, or None.
        attrs: non-tensor saved attributes, values as strings.
        saved: tensors the node saved for backward.
        tensor: shape/dtype/name for ``leaf`` and ``output`` nodes, else None.
        order: position in the engine's execution order when the graph was annotated by
            ``gs.record_backward`` (0 runs first), else None.
    """

    id: str
    name: str
    kind: str
    module: str | None = None
    attrs: dict[str, str] = field(default_factory=dict)
    saved: list[SavedTensor] = field(default_factory=list)
    tensor: TensorInfo | None = None
    order: int | None = None

    @property
    def saved_bytes(self) -> int:
        """Bytes of this node's saved tensors that are still held (freed ones count 0)."""
        return sum(s.nbytes for s in self.saved if not s.freed)


@dataclass(slots=True)
class Edge:
    """``dst`` is in ``src``'s ``next_functions``: in backward, gradient flows src -> dst.

    Attributes:
        src: id of the node whose backward produces the gradient.
        dst: id of the node that receives it.
        input_nr: position in ``src.next_functions``, i.e. the slot of src's forward inputs.
        kind: ``grad`` for autograd edges, ``view`` for the dotted link from a view output to
            its base tensor (drawn as torchviz does).
        grad_norm: norm of the gradient that flowed along the edge, when the graph was
            annotated by ``gs.record_backward``; else None.
        count: how many edges this one stands for (merged edges of collapsed views), else 1.
    """

    src: str
    dst: str
    input_nr: int = 0
    kind: str = "grad"
    grad_norm: float | None = None
    count: int = 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Edge):
            return NotImplemented
        return (self.src, self.dst, self.input_nr, self.kind, self.count) == (
            other.src,
            other.dst,
            other.input_nr,
            other.kind,
            other.count,
        ) and _same_float(self.grad_norm, other.grad_norm)


@dataclass(eq=True)
class Graph:
    """An autograd graph as plain data. Build one with ``gradscope.trace``.

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.ones(3, requires_grad=True)
        >>> g = gs.trace((x * 2).sum(), params={"x": x})
        >>> [n.name for n in g.nodes]
        ['output', 'SumBackward0', 'MulBackward0', 'AccumulateGrad', 'x']
    """

    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ lookup
    def node(self, node_id: str) -> Node:
        """The node with id ``node_id`` (KeyError if absent)."""
        index = self.__dict__.get("_index")
        if index is None or len(index) != len(self.nodes):
            index = {n.id: n for n in self.nodes}
            self.__dict__["_index"] = index
        return index[node_id]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (self.nodes, self.edges, self.roots) == (other.nodes, other.edges, other.roots)

    def children(self) -> dict[str, list[Edge]]:
        """Outgoing edges per node id, in ``next_functions`` order."""
        out: dict[str, list[Edge]] = {n.id: [] for n in self.nodes}
        for e in self.edges:
            out[e.src].append(e)
        return out

    @property
    def backward_nodes(self) -> list[Node]:
        """The autograd nodes proper (kinds op, custom, accumulate)."""
        return [n for n in self.nodes if n.kind in ("op", "custom", "accumulate")]

    # ------------------------------------------------------------------ summaries
    def saved_bytes(self) -> int:
        """Bytes held by saved tensors, each storage counted once (freed ones count 0)."""
        seen: dict[str, int] = {}
        total_unkeyed = 0
        for n in self.nodes:
            for s in n.saved:
                if s.freed:
                    continue
                if s.storage is None:
                    total_unkeyed += s.nbytes
                else:
                    seen[s.storage] = max(seen.get(s.storage, 0), s.nbytes)
        return sum(seen.values()) + total_unkeyed

    def summary(self) -> str:
        """One line: node counts by kind, edges, saved tensors and their bytes."""
        kinds = Counter(n.kind for n in self.nodes)
        parts = [f"{kinds[k]} {k}" for k in KINDS if kinds[k]]
        n_saved = sum(len(n.saved) for n in self.nodes)
        n_freed = sum(1 for n in self.nodes for s in n.saved if s.freed)
        freed = f" ({n_freed} freed)" if n_freed else ""
        return (
            f"{len(self.nodes)} nodes ({', '.join(parts) or 'none'}), {len(self.edges)} edges, "
            f"{n_saved} saved tensors{freed} holding {format_bytes(self.saved_bytes())}"
        )

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict of schema version 1."""
        return {
            "gradscope": SCHEMA_VERSION,
            "roots": list(self.roots),
            "nodes": [_node_to_dict(n) for n in self.nodes],
            "edges": [_edge_to_dict(e) for e in self.edges],
        }

    def to_json(self) -> str:
        """JSON text (schema version 1), one node or edge per line for readable diffs."""
        d = self.to_dict()
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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Graph:
        """Inverse of ``to_dict``."""
        if not isinstance(d, dict) or d.get("gradscope") != SCHEMA_VERSION:
            raise GradscopeError(
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
            raise GradscopeError(
                f"malformed gradscope graph JSON: missing or bad field {exc}"
            ) from None
        return cls(nodes=nodes, edges=edges, roots=roots)

    @classmethod
    def from_json(cls, s: str) -> Graph:
        """Parse JSON written by ``to_json``: ``Graph.from_json(g.to_json()) == g``."""
        try:
            data = json.loads(s)
        except json.JSONDecodeError as exc:
            raise GradscopeError(
                f"not valid JSON ({exc}); expected the output of Graph.to_json()"
            ) from None
        return cls.from_dict(data)

    # ------------------------------------------------------------------ derived graphs
    def collapse(self, depth: int) -> Graph:
        """A new graph where each module deeper than ``depth`` is one ``module`` node."""
        from ._views import collapse

        return collapse(self, depth)

    def fold(self) -> Graph:
        """A new graph where runs of identical sibling modules fold into one box."""
        from ._views import fold

        return fold(self)

    def memory(self) -> Any:
        """Bytes held by saved tensors, per storage, node and module (see ``MemoryReport``)."""
        from ._memory import graph_memory

        return graph_memory(self)

    # ------------------------------------------------------------------ views
    def to_html(self, **options: Any) -> str:
        """A self-contained interactive HTML page of the graph (works offline)."""
        from ._render_html import to_html

        return to_html(self, **options)

    def to_dot(
        self,
        *,
        saved: bool = True,
        attrs: bool = False,
        max_attr_chars: int = 50,
        clusters: bool = True,
        **options: Any,
    ) -> str:
        """DOT text: torchviz's colours, saved tensors as orange boxes when ``saved``, nodes
        grouped in nested clusters by module path when ``clusters`` and modules are known."""
        from ._render_dot import to_dot

        return to_dot(
            self,
            saved=saved,
            attrs=attrs,
            max_attr_chars=max_attr_chars,
            clusters=clusters,
            **options,
        )

    def to_tree(self, **kwargs: Any) -> Any:
        """A ``rich`` renderable tree of the graph (see ``gradscope.render_tree``)."""
        from ._render_tree import render_tree

        return render_tree(self, **kwargs)

    def save(self, path: str | Path, format: str | None = None, **options: Any) -> Path:
        """Write the graph; ``format`` (dot/svg/png/pdf/json) defaults to the path's suffix."""
        from ._output import save_graph

        return save_graph(self, path, format=format, **options)

    def render(self, format: str, **options: Any) -> bytes:
        """The graph rendered as bytes in ``format`` (dot/svg/png/pdf/json)."""
        from ._output import render_bytes

        return render_bytes(self, format, **options)

    def _repr_svg_(self) -> str | None:
        from ._output import dot_binary

        if dot_binary() is None:
            return None
        return self.render("svg").decode("utf-8")


def _same_float(a: float | None, b: float | None) -> bool:
    """Equality that treats NaN as equal to NaN (a recorded NaN norm must round-trip)."""
    if a is None or b is None:
        return a is b
    return a == b or (a != a and b != b)


def _float_to_json(x: float) -> float | str:
    """Strict JSON has no NaN/Infinity: write them as the strings "nan", "inf", "-inf"."""
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return x


def format_bytes(n: float) -> str:
    """Human-readable bytes: ``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024.0
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


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
