"""The graph model: plain data, no torch objects.

Capture (``gradscope._capture``) fills these dataclasses from a live autograd graph; renderers
read them. Nothing here imports torch, so a ``Graph`` can be serialised, compared, and kept after
the autograd graph it describes is gone, without keeping any tensor alive.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
        """The JSON-ready dict of the current schema version (see ``gradscope.model.schema``)."""
        from .schema import graph_to_dict

        return graph_to_dict(self)

    def to_json(self) -> str:
        """JSON text, one node or edge per line for readable diffs."""
        from .schema import graph_to_json

        return graph_to_json(self)

    @classmethod
    def from_dict(cls, d: Any) -> Graph:
        """Inverse of ``to_dict``; also reads older schema versions.

        Raises:
            SchemaError: ``d`` is not a valid gradscope graph (the message names the JSON path).
        """
        from .schema import graph_from_dict

        return graph_from_dict(d)

    @classmethod
    def from_json(cls, s: str | bytes) -> Graph:
        """Parse JSON written by ``to_json``: ``Graph.from_json(g.to_json()) == g``.

        Raises:
            SchemaError: not JSON, or not a valid gradscope graph.
        """
        from .schema import graph_from_json

        return graph_from_json(s)

    # ------------------------------------------------------------------ derived graphs
    def collapse(self, depth: int) -> Graph:
        """A new graph where each module deeper than ``depth`` is one ``module`` node."""
        from .transforms import collapse

        return collapse(self, depth)

    def fold(self) -> Graph:
        """A new graph where runs of identical sibling modules fold into one box."""
        from .transforms import fold

        return fold(self)

    def memory(self) -> Any:
        """Bytes held by saved tensors, per storage, node and module (see ``MemoryReport``)."""
        from .memory import graph_memory

        return graph_memory(self)

    # ------------------------------------------------------------------ views (the registry)
    def to_dot(self, **options: Any) -> str:
        """DOT text: torchviz's colours, saved tensors as orange boxes (``saved=True``), nodes
        grouped in nested clusters by module path (``clusters=True``); see
        ``gradscope.views.dot.to_dot`` for every option."""
        return self.render("dot", **options).decode("utf-8")

    def to_html(self, **options: Any) -> str:
        """A self-contained interactive HTML page of the graph (works offline)."""
        return self.render("html", **options).decode("utf-8")

    def to_tree(self, **options: Any) -> Any:
        """A ``rich`` renderable tree of the graph (see ``gradscope.render_tree``)."""
        from .formats import renderer

        return renderer("tree")(self, **options)

    def save(self, path: str | Path, format: str | None = None, **options: Any) -> Path:
        """Write the graph atomically; ``format`` (see ``gs.FORMATS``) defaults to the suffix.

        Raises:
            FormatError: unknown format, or an option that format does not take.
            OutputError: the file could not be written (the previous one is unchanged).
        """
        from .formats import save_graph

        return save_graph(self, path, format=format, **options)

    def render(self, format: str, **options: Any) -> bytes:
        """The graph rendered as bytes in ``format`` (see ``gs.FORMATS``)."""
        from .formats import render_graph

        return render_graph(self, format, **options)

    def _repr_svg_(self) -> str | None:
        from .formats import renderer

        if not renderer("graphviz_available")():
            return None
        return self.render("svg").decode("utf-8")


def _same_float(a: float | None, b: float | None) -> bool:
    """Equality that treats NaN as equal to NaN (a recorded NaN norm must round-trip)."""
    if a is None or b is None:
        return a is b
    return a == b or (a != a and b != b)


def format_bytes(n: float) -> str:
    """Human-readable bytes: ``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024.0
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")
