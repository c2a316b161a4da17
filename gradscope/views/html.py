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
"""

from __future__ import annotations

import heapq
import html
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ..model.formats import FormatKind, OutputFormat, register_format, register_renderer
from ..model.graph import Graph, Node, SavedTensor, format_bytes
from ..model.nodes import KINDS, saved_bytes_of, storage_sizes
from ..model.paths import levels, module_class, node_paths
from ..model.schema import EDGE_KINDS, float_to_json
from ..model.transforms import Run, fold_runs
from .dot import BAD_OTHER_COLOR, OP_COLOR, attr_entries, short_location
from .style import (
    BAD_COLOR,
    BASE_COLOR,
    CUSTOM_COLOR,
    FOLDED_COLOR,
    FREED_COLOR,
    LEAF_COLOR,
    MODULE_COLOR,
    NONFINITE_BAND,
    NORM_BANDS,
    OUTPUT_COLOR,
    SAVED_COLOR,
    clean_text,
)

ASSETS = Path(__file__).resolve().parent / "assets"

#: No layout call sees more than this many items: a container holding more is cut into chunks.
CHUNK = 150
#: Rows of nodes (or edges) per JSON block of the page: each block is parsed in its own task.
PART = 5_000
#: Items drawn in the first view when neither ``depth`` nor ``full`` is given.
BUDGET = 600
#: Module levels the page nests containers to: a node deeper sits in the container at this
#: depth, its own path in its details (a path 100,000 levels deep costs its length, no more).
MAX_LEVELS = 64

#: The page's data contract: every row of the page is a list whose positions are named here
#: (the page reads the names from ``fields`` in its data, never a position of its own), and trailing
#: fields at their default are left out. Node and edge kinds are written as indices into the
#: model's own tables (``model.nodes.KINDS``, ``model.schema.EDGE_KINDS``), sent with the data.
#: A new field is a name here and a value where the rows are written.
FIELDS: dict[str, tuple[str, ...]] = {
    "nodes": ("id", "name", "kind", "container", "info"),
    "edges": ("src", "dst", "input_nr", "kind", "count", "grad_norm"),
    "containers": ("path", "label", "cls", "kind", "parent", "depth", "count", "saved_bytes",
                   "members", "sum_count", "sum_bytes", "range"),
    # lists inside a node's info: its saved tensors (s), tensor (t), module box, compiled region
    "saved": ("name", "shape", "dtype", "nbytes", "storage", "freed"),
    "tensor": ("name", "shape", "dtype", "device"),
    "box": ("cls", "nodes", "saved_bytes", "repeat"),
    "region": ("ops", "note"),
}
#: Defaults of the optional (trailing) fields, left out of a row when every later one is too.
DEFAULTS: dict[str, dict[str, Any]] = {
    "nodes": {"info": None},
    "edges": {"input_nr": 0, "kind": 0, "count": 1, "grad_norm": None},
    "containers": {"members": None, "sum_count": 0, "sum_bytes": 0, "range": None},
    "saved": {}, "tensor": {}, "box": {}, "region": {},
}


def _row(table: str, values: dict[str, Any]) -> list[Any]:
    """One compact row of ``table``: the values in ``FIELDS`` order, trailing defaults dropped."""
    names = FIELDS[table]
    defaults = DEFAULTS[table]
    row = [values.get(name, defaults.get(name)) for name in names]
    while row and names[len(row) - 1] in defaults and row[-1] == defaults[names[len(row) - 1]]:
        row.pop()
    return row


#: The X11 colours of the DOT views as CSS hex: the page draws with the same palette.
GRAPHVIZ_HEX = {
    "lightgrey": "#d3d3d3", "lightblue": "#add8e6", "orange": "#ffa500",
    "darkolivegreen1": "#caff70", "darkolivegreen3": "#a2cd5a", "plum1": "#ffbbff",
    "gray90": "#e5e5e5", "red": "#ff0000", "lightcoral": "#f08080", "lightyellow": "#ffffe0",
    "lightgoldenrod1": "#ffec8b",
}
PAGE_COLORS = {
    "op": OP_COLOR, "accumulate": OP_COLOR, "custom": CUSTOM_COLOR, "leaf": LEAF_COLOR,
    "output": OUTPUT_COLOR, "base": BASE_COLOR, "saved": SAVED_COLOR, "freed": FREED_COLOR,
    "bad": BAD_COLOR, "bad_other": BAD_OTHER_COLOR, "module": MODULE_COLOR,
    "folded": FOLDED_COLOR,
}


def _css(color: str) -> str:
    return color if color.startswith("#") else GRAPHVIZ_HEX[color]


def _norm_scale() -> list[list[Any]]:
    """The one gradient-norm scale (``views.style.NORM_BANDS``) as the page reads it:
    [name, upper bound or null, colour], lowest band first, then the non-finite band."""
    bands = [[b.name, None if math.isinf(b.upper) else b.upper, _css(b.color)] for b in NORM_BANDS]
    return bands + [[NONFINITE_BAND.name, None, _css(NONFINITE_BAND.color)]]
#: A container row's kind: the root, a module, a fold of repeated layers, a chunk of a long run.
_KIND_CODE = {"root": "r", "module": "m", "fold": "f", "chunk": "k"}


@cache
def _asset(name: str) -> str:
    text = (ASSETS / name).read_text(encoding="utf-8")
    # A source-map comment would make devtools fetch a file that is not there: drop it.
    lines = [ln for ln in text.splitlines() if not ln.startswith("//# sourceMappingURL=")]
    text = "\n".join(lines)
    # Inlined scripts must not contain their own end tag.
    return text.replace("</script", "<\\/script") if name.endswith(".js") else text


@dataclass
class DiffMarks:
    """What a diff page colours: node id -> ``added``/``removed``/``changed``, edge index ->
    gradient-norm ratio b/a, the diff's one-line summary, and edge index -> ``added`` or
    ``removed``."""

    marks: dict[str, str]
    ratios: dict[int, float]
    summary: str
    edges: dict[int, str] = field(default_factory=dict)


# ---------------------------------------------------------------------- containers
@dataclass
class _Container:
    path: str
    label: str
    cls: str
    kind: str  # "root", "module", "fold", "chunk"
    parent: int  # index, -1 for the root
    depth: int  # module levels (a fold has its members' depth, a chunk its parent's)
    nodes: list[int] = field(default_factory=list)  # direct node indices
    kids: list[int] = field(default_factory=list)  # direct child containers
    members: list[int] = field(default_factory=list)  # a fold's members, in index order
    count: int = 0  # original nodes inside, all levels
    saved_bytes: int = 0


class _Builder:
    """Containers of a graph: modules by path, folds of repeated siblings, chunks of long
    containers (one layout never sees more than ``CHUNK`` items)."""

    def __init__(self, graph: Graph, fold: bool) -> None:
        self.graph = graph
        self._adj: list[list[int]] | None = None
        self.index = {n.id: i for i, n in enumerate(graph.nodes)}
        self.paths = node_paths(graph)
        self.containers: list[_Container] = [_Container("", "(model)", "", "root", -1, 0)]
        self.by_path: dict[str, int] = {"": 0}
        self.node_container = [0] * len(graph.nodes)
        self.ranges: dict[int, str] = {}  # a chunk's first and last node id
        runs = fold_runs(graph, inside="all") if fold else []
        self.run_of: dict[str, Run] = {}  # member path -> its run
        for run in runs:
            for m in run.members:
                self.run_of[m] = run
        self._place_nodes()
        self._chunk_all()
        self._totals()

    # -------------------------------------------------------------- module tree
    def _container(self, lv: list[str]) -> int:
        """Index of the container of module levels ``lv``, creating it (and its parents and
        folds) as needed; iterative, so no path is too deep for it."""
        lv = lv[:MAX_LEVELS]
        paths = []
        for depth in range(len(lv), 0, -1):  # the deepest container that exists already
            path = ".".join(lv[:depth])
            found = self.by_path.get(path)
            if found is not None:
                break
            paths.append(path)
        else:
            found, depth = 0, 0
        for path, d in zip(reversed(paths), range(depth + 1, len(lv) + 1), strict=True):
            parent = found
            run = self.run_of.get(path)
            if run is not None:
                parent = self._fold(run, parent)
            c = _Container(path, lv[d - 1], "", "module", parent, d)
            found = self._add(c)
            if run is not None:
                self.containers[parent].members.append(found)
            self.by_path[path] = found
        return found

    def _fold(self, run: Run, parent: int) -> int:
        found = self.by_path.get("\x00fold:" + run.path)
        if found is not None:
            return found
        label = f"{levels(run.path)[-1]} x{run.repeat}"
        c = _Container(run.path, label, run.cls, "fold", parent, len(levels(run.path)))
        idx = self._add(c)
        self.by_path["\x00fold:" + run.path] = idx
        return idx

    def _add(self, c: _Container) -> int:
        self.containers.append(c)
        idx = len(self.containers) - 1
        if c.parent >= 0:
            self.containers[c.parent].kids.append(idx)
        return idx

    def _place_nodes(self) -> None:
        for i, n in enumerate(self.graph.nodes):
            path = self.paths[n.id]
            lv = levels(path) if path else []
            if lv and n.kind == "module":
                lv = lv[:-1]  # a box of a collapsed graph sits in its module's parent
            c = self._container(lv)
            self.node_container[i] = c
            self.containers[c].nodes.append(i)
        self._classes()
        for cont in self.containers:  # folds list their members in index order
            if cont.kind == "fold":
                order = {p: k for k, p in enumerate(self._run_members(cont))}
                cont.members.sort(key=lambda i: order.get(self.containers[i].path, 0))
                cont.kids.sort(key=lambda i: order.get(self.containers[i].path, 0))

    def _run_members(self, fold: _Container) -> tuple[str, ...]:
        first = self.containers[fold.members[0]].path
        return self.run_of[first].members

    def _classes(self) -> None:
        """A module's class, from a node inside it that knows (``module_classes``)."""
        samples: dict[int, list[Node]] = {}
        for i, n in enumerate(self.graph.nodes):
            if n.kind != "module" and not n.module_classes:
                continue
            c = self.node_container[i]
            while c > 0:
                got = samples.setdefault(c, [])
                if len(got) < 4:
                    got.append(n)
                c = self.containers[c].parent
        for idx, cont in enumerate(self.containers):
            if cont.kind == "module":
                cont.cls = module_class(cont.path, samples.get(idx, []))

    # -------------------------------------------------------------- chunks
    def _items(self, idx: int) -> list[tuple[str, int]]:
        c = self.containers[idx]
        items = [("n", i) for i in c.nodes] + [("c", k) for k in c.kids]
        return items

    def _chunk_all(self) -> None:
        for idx in range(len(self.containers)):  # chunks appended during the loop are small
            if len(self._items(idx)) > CHUNK:
                self._chunk(idx)

    def _chunk(self, idx: int) -> None:
        """Cut a container's direct items, in forward (topological) order, into nested groups
        of at most ``CHUNK``, balanced: 20,000 items -> 142 chunks of 141."""
        c = self.containers[idx]
        items = self._forward_order(idx)
        n = len(items)
        levels_needed = 1
        while CHUNK ** (levels_needed + 1) < n:
            levels_needed += 1
        fan = max(2, math.ceil(n ** (1.0 / (levels_needed + 1))))
        c.nodes, c.kids = [], []
        groups: list[tuple[str, Any]] = items
        for _ in range(levels_needed):
            packed = []
            for start in range(0, len(groups), fan):
                part = groups[start:start + fan]
                packed.append(("g", part))
            groups = packed
        for kind, value in groups:
            self._attach(idx, kind, value)

    def _attach(self, parent: int, kind: str, value: Any) -> None:
        p = self.containers[parent]
        if kind == "n":
            p.nodes.append(value)
            self.node_container[value] = parent
        elif kind == "c":
            p.kids.append(value)
            self.containers[value].parent = parent
        else:
            first, last = self._ends(value)
            chunk = _Container(p.path, "", "", "chunk", parent, p.depth)
            cidx = self._add(chunk)
            self.ranges[cidx] = f"{first} … {last}"
            for k, v in value:
                self._attach(cidx, k, v)
            chunk.label = self._ops_label(cidx)

    def _ops_label(self, idx: int) -> str:
        """A chunk's label: the ops it holds, most frequent first (at most three named), and
        how many nodes: ``MulBackward0, AddBackward0, TanhBackward0 ×47``."""
        inside = [self.graph.nodes[i] for i in self._all_nodes(idx)]
        ops = [n for n in inside if n.kind in ("op", "custom", "module")] or inside
        names = Counter(n.name for n in ops)
        top = [name for name, _ in names.most_common(3)]
        more = f" +{len(names) - 3} more" if len(names) > 3 else ""
        total = len(inside)
        return f"{', '.join(top)}{more} ×{total}"

    def _ends(self, group: list[tuple[str, Any]]) -> tuple[str, str]:
        def first(item: tuple[str, Any], last: bool) -> str:
            kind, v = item
            while kind == "g":
                kind, v = v[-1] if last else v[0]
            if kind == "n":
                return self.graph.nodes[v].id
            return self.containers[v].label

        return first(group[0], False), first(group[-1], True)

    def _forward_order(self, idx: int) -> list[tuple[str, int]]:
        """The container's items in forward order (inputs first), by Kahn's algorithm over the
        edges between them; ties (and cycles) broken by walk order, reversed."""
        items = self._items(idx)
        owner: dict[int, tuple[str, int]] = {}
        first_seen: dict[tuple[str, int], int] = {}
        for it in items:
            inside = [it[1]] if it[0] == "n" else self._all_nodes(it[1])
            for node in inside:
                owner[node] = it
            first_seen[it] = min(inside) if inside else 0
        succ: dict[tuple[str, int], set[tuple[str, int]]] = {it: set() for it in items}
        indeg = dict.fromkeys(items, 0)
        graph_edges = self.graph.edges
        for node, a in owner.items():
            for k in self.adjacency()[node]:  # edges whose input (dst) is this node
                b = owner.get(self.index[graph_edges[k].src])
                if b is None or a == b or b in succ[a]:
                    continue
                succ[a].add(b)
                indeg[b] += 1
        # later in walk order = nearer the inputs: those come first in forward order
        heap = [(-first_seen[it], it) for it in items if indeg[it] == 0]
        heapq.heapify(heap)
        out: list[tuple[str, int]] = []
        done: set[tuple[str, int]] = set()
        remaining = sorted(items, key=lambda it: -first_seen[it])
        cursor = 0
        while len(out) < len(items):
            if not heap:  # a cycle between items: take the next one in walk order
                while remaining[cursor] in done:
                    cursor += 1
                heap.append((-first_seen[remaining[cursor]], remaining[cursor]))
            _, it = heapq.heappop(heap)
            if it in done:
                continue
            done.add(it)
            out.append(it)
            for nxt in succ[it]:
                indeg[nxt] -= 1
                if indeg[nxt] == 0 and nxt not in done:
                    heapq.heappush(heap, (-first_seen[nxt], nxt))
        return out

    def adjacency(self) -> list[list[int]]:
        """Edge indices by their dst node (the edge's input side in forward direction)."""
        if self._adj is None:
            self._adj = [[] for _ in self.graph.nodes]
            for k, e in enumerate(self.graph.edges):
                self._adj[self.index[e.dst]].append(k)
        return self._adj

    def subtree_nodes(self, idx: int) -> list[int]:
        """Indices of every node inside container ``idx``, all levels."""
        return self._all_nodes(idx)

    def _all_nodes(self, idx: int) -> list[int]:
        out: list[int] = []
        todo = [idx]
        while todo:
            c = self.containers[todo.pop()]
            out.extend(c.nodes)
            todo.extend(c.kids)
        return out

    def _first_node(self, item: tuple[str, int]) -> int:
        if item[0] == "n":
            return item[1]
        nodes = self._all_nodes(item[1])
        return min(nodes) if nodes else 0

    # -------------------------------------------------------------- totals
    def _totals(self) -> None:
        """Node counts and saved bytes of every container, each storage once at its whole size
        (``model.nodes.storage_sizes``, as ``Graph.saved_bytes`` counts), children first."""
        nodes = self.graph.nodes
        order = sorted(range(len(self.containers)), key=lambda i: -self._level(i))
        storages: dict[int, dict[str, int]] = {}
        for idx in order:
            c = self.containers[idx]
            seen = storages.pop(idx, {})
            direct = [nodes[i] for i in c.nodes]
            for n in direct:
                c.count += n.count
            for sid, size in storage_sizes(direct).items():
                if seen.get(sid, -1) < size:
                    seen[sid] = size
            c.saved_bytes = sum(seen.values())
            if c.parent >= 0:
                self.containers[c.parent].count += c.count
                up = storages.setdefault(c.parent, {})
                for sid, size in seen.items():
                    if up.get(sid, -1) < size:
                        up[sid] = size

    def _level(self, idx: int) -> int:
        d = 0
        while idx > 0:
            idx = self.containers[idx].parent
            d += 1
        return d


# ---------------------------------------------------------------------- the page's data
def _saved(s: SavedTensor) -> list[Any]:
    return _row("saved", {"name": s.name, "shape": s.shape, "dtype": s.dtype, "nbytes": s.nbytes,
                          "storage": s.storage, "freed": 1 if s.freed else 0})


#: The forward arguments behind ``next_functions`` slots of a few common ops, from their ATen
#: signatures (``addmm(self, mat1, mat2)``...); every other op: slot 0 is ``self``/``input``.
_SLOTS = {
    "AddmmBackward0": ("self", "mat1", "mat2"),
    "MmBackward0": ("self", "mat2"),
    "BmmBackward0": ("self", "mat2"),
    "MulBackward0": ("self", "other"),
    "DivBackward0": ("self", "other"),
    "ConvolutionBackward0": ("input", "weight", "bias"),
}
_SIZES = re.compile(r"\(\s*(\d+\s*,?\s*)*\)")


def _output_shapes(graph: Graph, index: dict[str, int]) -> list[list[int | None] | None]:
    """Each node's forward output shape where the graph tells it: a tensor's own shape, an op's
    saved ``result``, or what its consumer saved of that input (the tensor, or its
    ``<name>_sym_sizes``) for the argument at the edge's slot; else None. An AccumulateGrad's is
    its parameter's."""
    shapes: list[list[int | None] | None] = [None] * len(graph.nodes)
    for i, n in enumerate(graph.nodes):
        if n.tensor is not None:
            shapes[i] = list(n.tensor.shape)
            continue
        for s in n.saved:
            if s.name == "result" and s.shape is not None:
                shapes[i] = list(s.shape)
                break
    leaf_of = {}
    for e in graph.edges:
        dst = index[e.dst]
        src = graph.nodes[index[e.src]]
        if src.kind == "accumulate" and graph.nodes[dst].kind == "leaf":
            leaf_of[index[e.src]] = dst
        if shapes[dst] is not None or src.kind != "op" or e.kind != "grad":
            continue
        slots = _SLOTS.get(src.name, ("self|input",))
        if e.input_nr >= len(slots):
            continue
        names = slots[e.input_nr].split("|")
        saved = {s.name: s.shape for s in src.saved if s.shape is not None}
        shape = next((saved[name] for name in names if name in saved), None)
        if shape is None:
            sizes = next((src.attrs[f"{name}_sym_sizes"] for name in names
                          if f"{name}_sym_sizes" in src.attrs), None)
            if sizes and _SIZES.fullmatch(sizes):
                shape = [int(v) for v in re.findall(r"\d+", sizes)]
        if shape is not None:
            shapes[dst] = list(shape)
    for acc, leaf in leaf_of.items():
        if shapes[acc] is None:
            shapes[acc] = shapes[leaf]
    return shapes


def _node_info(
    node: Node, path: str | None, cpath: str, shape: list[int | None] | None, note: str | None,
    root: str | None,
) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if node.saved:
        info["s"] = [_saved(s) for s in node.saved]
    t = node.tensor
    if t is not None:
        info["t"] = _row("tensor", {"name": t.name, "shape": t.shape, "dtype": t.dtype,
                                    "device": t.device})
    attrs = attr_entries(node) if node.kind in ("op", "accumulate") else {}
    if node.kind == "custom":
        attrs = dict(node.attrs)
    attrs = {k: v for k, v in attrs.items() if v not in ("[saved tensor]", "[saved tensors]")}
    if attrs:
        info["a"] = attrs
    if node.kind == "module":
        box = node.box
        info["box"] = _row("box", {"cls": box.cls, "nodes": box.nodes,
                                   "saved_bytes": box.saved_bytes, "repeat": box.repeat or 0}
                           if box is not None else
                           {"cls": "", "nodes": 1, "saved_bytes": node.saved_bytes, "repeat": 0})
    if node.order is not None:
        info["o"] = node.order
    bad = node.nonfinite
    if bad:
        info["bad"] = bad
        if node.first_nonfinite:
            info["first"] = 1
    if node.forward_nonfinite:
        info["fwd"] = node.forward_nonfinite
    if node.compiled is not None:
        info["region"] = _row("region", {"ops": node.compiled.ops, "note": node.compiled.note})
    where = node.created_at
    if where:
        info["at"] = short_location(where, root)
    if node.view_base:
        info["base"] = 1
    if path is not None and path != cpath:
        info["m"] = path
    if shape is not None and node.kind not in ("leaf", "output"):
        info["sh"] = shape
    if note:
        info["mem"] = note
    return info


def graph_data(
    graph: Graph,
    *,
    depth: int | None = None,
    full: bool = False,
    fold: bool = True,
    saved: bool = True,
    notes: dict[str, str] | None = None,
    root: str | Path | None = None,
    budget: int = BUDGET,
    diff: DiffMarks | None = None,
) -> dict[str, Any]:
    """The JSON the page embeds (version 2: compact rows named by ``FIELDS``, see
    ``viewer.js``); ``diff`` colours a diff of two graphs (``views.diff``)."""
    marks = diff.marks if diff is not None else None
    b = _Builder(graph, fold)
    root_dir = None if root is None else str(root)
    shapes = _output_shapes(graph, b.index)
    index = b.index
    nodes = []
    for i, n in enumerate(graph.nodes):
        cidx = b.node_container[i]
        cpath = b.containers[cidx].path
        info = _node_info(n, b.paths[n.id], cpath, shapes[i],
                          notes.get(n.id) if notes else None, root_dir)
        if marks and n.id in marks:
            info["diff"] = marks[n.id]
        nodes.append(_row("nodes", {
            "id": n.id, "name": n.name, "kind": KINDS.index(n.kind) if n.kind in KINDS else 0,
            "container": cidx, "info": info or None,
        }))
    edges = []
    for e in graph.edges:
        edges.append(_row("edges", {
            "src": index[e.src], "dst": index[e.dst], "input_nr": e.input_nr,
            "kind": EDGE_KINDS.index(e.kind) if e.kind in EDGE_KINDS else 1, "count": e.count,
            "grad_norm": None if e.grad_norm is None else float_to_json(e.grad_norm, 4),
        }))
    containers: list[list[Any]] = []
    for c in b.containers:
        values: dict[str, Any] = {
            "path": c.path, "label": c.label, "cls": c.cls, "kind": _KIND_CODE[c.kind],
            "parent": c.parent, "depth": c.depth, "count": c.count, "saved_bytes": c.saved_bytes,
            "range": b.ranges.get(len(containers)),
        }
        if c.kind == "fold":
            rest = [k for m in c.members[1:] for k in b.subtree_nodes(m)]
            values |= {"members": c.members, "sum_count": sum(graph.nodes[i].count for i in rest),
                       "sum_bytes": saved_bytes_of([graph.nodes[i] for i in rest])}
        containers.append(_row("containers", values))
    first = next((index[n.id] for n in graph.nodes if n.first_nonfinite), -1)
    return {
        "v": 2,
        "nodes": nodes,
        "edges": edges,
        "containers": containers,
        "roots": [index[r] for r in graph.roots if r in index],
        "first": first,
        "summary": graph.summary(),
        "total_bytes": graph.saved_bytes(),
        "total_bytes_text": format_bytes(graph.saved_bytes()),
        "options": {"depth": depth, "full": full, "saved": saved, "budget": budget,
                    "chunk": CHUNK, "memory": bool(notes),
                    "backward": any(n.order is not None for n in graph.nodes)},
        "style": {"colors": {k: _css(v) for k, v in PAGE_COLORS.items()}, "norm": _norm_scale()},
        "fields": {k: list(v) for k, v in FIELDS.items()},
        "kinds": list(KINDS),
        "edge_kinds": list(EDGE_KINDS),
        "diff": None if diff is None else {
            "summary": diff.summary,
            "ratios": sorted([k, float_to_json(r, 4)] for k, r in diff.ratios.items()),
            "edges": sorted([k, m] for k, m in diff.edges.items())},
    }


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

    Returns:
        The page as a string; write it to a ``.html`` file (``Graph.save("g.html")``).

    Example:
        >>> from gradscope.model.graph import Graph, Node
        >>> page = to_html(Graph([Node("n0", "MulBackward0", "op")], roots=["n0"]))
        >>> page.startswith("<!DOCTYPE html>") and "MulBackward0" in page
        True
    """
    data = graph_data(graph, depth=depth, full=full, fold=fold, saved=saved, notes=notes,
                      root=root, budget=max_nodes, diff=diff)
    # Nodes and edges go in blocks of PART rows, each parsed in its own task by the page, so
    # no single JSON.parse of a 100,000-node graph holds the main thread.
    parts = []
    for kind in ("nodes", "edges"):
        rows = data.pop(kind)
        data["n_" + kind] = len(rows)
        for start in range(0, len(rows), PART):
            block = _json(rows[start:start + PART])
            parts.append(f'<script type="application/json" class="gs-part" data-kind="{kind}">'
                         f"{block}</script>")
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
HTML_OPTIONS = frozenset({"title", "depth", "full", "fold", "saved", "notes", "root", "max_nodes"})

register_format(
    OutputFormat("html", _render_html, HTML_OPTIONS, "interactive page, self-contained and offline",
                 kind=FormatKind.PAGE)
)
register_renderer("notebook_html", to_notebook_html)
