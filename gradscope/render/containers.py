"""The tree of containers the HTML page draws a graph as: the model's modules (``gs.scopes``
paths), folds of runs of identical layers (one member drawn, the others summarised) and, where a
container holds more direct items than one layout should see (a 20,000-op chain with no
modules), nested *chunks* of it in forward order, so no layout call in the page sees more than
``CHUNK`` items. Plain data over a ``Graph``; ``views.page_data`` writes it as the page's rows.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..graph.graph import Graph, Node
from ..graph.nodes import storage_sizes
from ..graph.paths import levels, module_class, node_paths
from ..graph.transforms import Run, fold_runs

#: No layout call sees more than this many items: a container holding more is cut into chunks.
CHUNK = 150
#: Module levels the page nests containers to: a node deeper sits in the container at this
#: depth, its own path in its details (a path 100,000 levels deep costs its length, no more).
MAX_LEVELS = 64


@dataclass
class Container:
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


class ContainerTree:
    """Containers of a graph: modules by path, folds of repeated siblings, chunks of long
    containers (one layout never sees more than ``CHUNK`` items)."""

    def __init__(self, graph: Graph, fold: bool) -> None:
        self.graph = graph
        self._adj: list[list[int]] | None = None
        self.index = {n.id: i for i, n in enumerate(graph.nodes)}
        self.paths = node_paths(graph)
        self.containers: list[Container] = [Container("", "(model)", "", "root", -1, 0)]
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
            c = Container(path, lv[d - 1], "", "module", parent, d)
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
        c = Container(run.path, label, run.cls, "fold", parent, len(levels(run.path)))
        idx = self._add(c)
        self.by_path["\x00fold:" + run.path] = idx
        return idx

    def _add(self, c: Container) -> int:
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

    def _run_members(self, fold: Container) -> tuple[str, ...]:
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
            chunk = Container(p.path, "", "", "chunk", parent, p.depth)
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
