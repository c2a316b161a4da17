"""``Graph``: an autograd graph as plain data, and the methods users call on it.

The records it holds live in ``gradscope.graph.nodes``; JSON in ``schema``, collapse and fold in
``transforms``, memory analysis in ``memory``, and every rendering goes through the format
registry (``formats``) that the views fill when ``gradscope`` is imported. This module imports
all of them and none of them imports it, so the model has no import cycle.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..memory import saved_records as memory
from ..output import formats
from . import schema, schema_write, transforms
from .nodes import (
    KINDS,
    Box,
    Edge,
    GraphLike,
    Node,
    Region,
    SavedTensor,
    TensorInfo,
    format_bytes,
    plural,
    saved_bytes_of,
)

#: How ``Graph.summary`` counts an ``output`` node that is a view's base (``Node.view_base``).
VIEW_BASE = "view base"
#: Notebooks get the Graphviz picture (``_repr_svg_``) only for graphs up to this many nodes.
SVG_NODES = 300

__all__ = [
    "KINDS", "Box", "Edge", "Graph", "GraphLike", "Node", "Region", "SavedTensor", "TensorInfo",
    "format_bytes",
]


@dataclass(eq=True)
class Graph:
    """An autograd graph as plain data. Build one with ``gradscope.trace``.

    Example:
        >>> g = Graph([Node("n0", "output", "output"), Node("n1", "SumBackward0", "op")],
        ...           [Edge("n0", "n1")], roots=["n0"])
        >>> g.node("n1").name, [e.dst for e in g.children()["n0"]]
        ('SumBackward0', ['n1'])
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
        """Bytes held by saved tensors, each storage counted once and whole (a saved slice
        keeps all of its storage alive), freed ones 0: ``memory().total``."""
        return saved_bytes_of(self.nodes)

    def summary(self) -> str:
        """One line: node counts by kind (view bases apart from outputs), edges, saved tensors
        and the bytes they hold: activations (held only by the graph) apart from those that
        alias parameters/inputs and outputs (alive anyway), each storage counted once.

        Example:
            >>> w = TensorInfo("w", [256], "float32", "cpu", storage="s0")
            >>> mul = Node("n1", "MulBackward0", "op", saved=[  # w * w.exp(): saves both
            ...     SavedTensor("self", [256], "float32", "cpu", 1024, "s0"),
            ...     SavedTensor("other", [256], "float32", "cpu", 1024, "s1")])
            >>> g = Graph([mul, Node("n2", "w", "leaf", tensor=w)], [Edge("n1", "n2")])
            >>> head, held = g.summary().split(", 2 saved tensors holding ")
            >>> head
            '2 nodes (1 op, 1 leaf), 1 edge'
            >>> held
            '1.0 KiB activations + 1.0 KiB params/inputs'
        """
        return ", ".join(self.summary_parts())

    def summary_parts(self) -> tuple[str, str]:
        """``summary()`` in its two parts, the structure and the memory, for a view that puts
        them on two lines (``gradscope tree`` does: one passes 80 columns on most graphs).

        Example:
            >>> Graph([Node("n0", "x", "leaf")]).summary_parts()
            ('1 node (1 leaf), 0 edges', '0 saved tensors holding 0 B')
        """
        kinds = Counter(VIEW_BASE if n.view_base else n.kind for n in self.nodes)
        order = [k for kind in KINDS for k in ((kind, VIEW_BASE) if kind == "output" else (kind,))]
        parts = [f"{kinds[k]} {k}" for k in order if kinds[k]]
        n_saved = sum(len(n.saved) for n in self.nodes)
        n_freed = sum(1 for n in self.nodes for s in n.saved if s.freed)
        freed = f" ({n_freed} freed)" if n_freed else ""
        split = memory.split_bytes(self.nodes, memory.alias_kinds(self))

        return (
            f"{plural(len(self.nodes), 'node')} ({', '.join(parts) or 'none'}), "
            f"{plural(len(self.edges), 'edge')}",
            f"{plural(n_saved, 'saved tensor')}{freed} holding {split}",
        )

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict of the current schema version (see ``gradscope.graph.schema``)."""
        return schema_write.graph_to_dict(self)

    def to_json(self) -> str:
        """JSON text, one node or edge per line for readable diffs (strict JSON)."""
        return schema_write.graph_to_json(self)

    @classmethod
    def from_dict(cls, d: Any) -> Graph:
        """Inverse of ``to_dict``; also reads older schema versions.

        Raises:
            SchemaError: ``d`` is not a valid gradscope graph (the message names the JSON path).
        """
        nodes, edges, roots = schema.read_dict(d)
        return cls(nodes=nodes, edges=edges, roots=roots)

    @classmethod
    def from_json(cls, s: str | bytes) -> Graph:
        """Parse JSON written by ``to_json``: ``Graph.from_json(g.to_json()) == g``.

        Raises:
            SchemaError: not JSON, or not a valid gradscope graph (the message names the JSON
                path of the first problem).
        """
        nodes, edges, roots = schema.read_json(s)
        return cls(nodes=nodes, edges=edges, roots=roots)

    # ------------------------------------------------------------------ derived graphs
    def collapse(self, depth: int) -> Graph:
        """A new graph where each module at ``depth`` is one ``module`` node (see
        ``gradscope.collapse``)."""
        return transforms.collapse(self, depth)

    def fold(self) -> Graph:
        """A new graph where runs of identical sibling modules fold into one box (see
        ``gradscope.fold``)."""
        return transforms.fold(self)

    def memory(self) -> memory.MemoryReport:
        """Bytes held by saved tensors, per storage, node and module (see ``MemoryReport``)."""
        return memory.graph_memory(self)

    # ------------------------------------------------------------------ views (the registry)
    def to_dot(self, **options: Any) -> str:
        """DOT text: torchviz's colours, saved tensors as orange boxes (``saved=True``), nodes
        grouped in nested clusters by module path (``clusters=True``); see
        ``gradscope.render.dot.to_dot`` for every option."""
        return self.to_bytes("dot", **options).decode("utf-8")

    def to_html(self, **options: Any) -> str:
        """A self-contained interactive HTML page of the graph (works offline)."""
        return self.to_bytes("html", **options).decode("utf-8")

    def to_tree(self, **options: Any) -> Any:
        """A ``rich`` renderable tree of the graph (see ``gradscope.render_tree``)."""
        return formats.renderer("tree")(self, **options)

    def save(self, path: str | Path, format: str | None = None, **options: Any) -> Path:
        """Write the graph atomically; ``format`` (see ``gs.FORMATS``) defaults to the suffix.

        Raises:
            FormatError: unknown format, or an option that format does not take.
            OutputError: the file could not be written (the previous one is unchanged).
        """
        return formats.save_graph(self, path, format=format, **options)

    def to_bytes(self, format: str, **options: Any) -> bytes:
        """The graph written in ``format`` (one of ``gs.FORMATS``), as bytes.

        Example:
            >>> g = Graph([Node("n0", "SumBackward0", "op")], [], ["n0"])
            >>> g.to_bytes("dot")[:7]
            b'digraph'
        """
        return formats.render_graph(self, format, **options)

    def render(self, format: str | None = None, **options: Any) -> Any:
        """A rich renderable, as ``render()`` is on every gradscope record: the graph as a tree
        for the terminal (``gs.render_tree``; ``rich.print(graph.render())``).

        ``render(format)`` (bytes in that format) is deprecated: call ``to_bytes(format)``.
        """
        if format is not None:
            import warnings

            warnings.warn(
                f"Graph.render({format!r}) is deprecated: call Graph.to_bytes({format!r}) for "
                "bytes (render() with no format is the terminal tree, as on every record)",
                DeprecationWarning, stacklevel=2,
            )
            return self.to_bytes(format, **options)
        return formats.renderer("tree")(self, **options)

    def __rich__(self) -> Any:
        return self.render()

    def __repr__(self) -> str:
        """One line, whatever the size: ``Graph(4365 nodes, 4728 edges, 1 root, 2.0 MiB saved)``
        (``summary()`` says more; the dataclass repr of every node would be megabytes)."""
        roots = len(self.roots)
        return (f"Graph({plural(len(self.nodes), 'node')}, {plural(len(self.edges), 'edge')}, "
                f"{plural(roots, 'root')}, {format_bytes(self.saved_bytes())} saved)")

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: Any
    ) -> dict[str, str]:
        """What a notebook stores for a displayed graph: one line of text, the interactive page
        (in a sandboxed frame sized to the graph) and, for graphs small enough to draw cheaply
        (``SVG_NODES``), the Graphviz picture for front-ends without JavaScript."""
        from ..output.formats import renderer

        bundle = {"text/plain": repr(self), "text/html": str(renderer("notebook_html")(self))}
        svg = self._repr_svg_()
        if svg is not None:
            bundle["image/svg+xml"] = svg
        return bundle

    def _repr_html_(self) -> str:
        """The interactive viewer for notebooks: the self-contained page in a sandboxed
        ``<iframe srcdoc>`` (front-ends without JavaScript show ``_repr_svg_``)."""
        from ..output.formats import renderer

        return str(renderer("notebook_html")(self))

    def _repr_svg_(self) -> str | None:
        """The Graphviz picture, for graphs of at most ``SVG_NODES`` nodes (a bigger one costs
        seconds and megabytes on every display: the page shows it instead)."""
        if len(self.nodes) > SVG_NODES or not formats.get_format("svg").available():
            return None
        return self.to_bytes("svg").decode("utf-8")
