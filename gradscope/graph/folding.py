"""Folding: each run of identical consecutive sibling modules (``layers.0`` ... ``layers.63``)
found and drawn as one box (``fold``, ``fold_runs``, ``Run``).

Runs are found from the top down over the graph's module tree (a ``ModuleTrie``, so any depth
costs the paths' length); two siblings fold when their signatures match (class, op nodes,
relative paths, saved shapes, inner edges) and no other module of their parent lies between
their calls. The boxes are made by ``regroup``. Importable from ``gradscope.graph.transforms``
too, with the other big-graph views.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ViewError
from ..memory.saved_records import alias_kinds
from .nodes import Edge, GraphLike, Node
from .paths import (
    ModuleTrie,
    levels,
    module_class,
    node_paths,
)
from .regroup import G, _box, _regroup

_INDEXED = re.compile(r"(?:(.*)\.)?(\d+)(#\d+)?\Z", re.S)
_REPEAT = re.compile(r"(.*?)(?:#(\d+))?\Z", re.S)


def _signature(key: str, group: list[Node], edges: list[Edge]) -> object:
    """What two sibling modules must share to fold: class, op nodes (by name, relative path and
    saved shapes) and the edges between them (``edges``: those with both ends inside the
    module). Parameters (``AccumulateGrad`` and leaves) are left out: a module called in a loop
    owns them in its first call only, yet every call is alike."""
    prefix = len(key)

    def sig(n: Node) -> tuple[object, ...]:
        rel = (n.module or "")[prefix:]
        shapes = tuple(tuple(s.shape or ()) for s in n.saved)
        label = n.count if n.kind == "module" else n.name
        return (n.kind, label, rel, shapes)

    by_id = {n.id: sig(n) for n in group if n.kind not in ("accumulate", "leaf")}
    inner = Counter(
        (by_id[e.src], by_id[e.dst], e.input_nr)
        for e in edges
        if e.src in by_id and e.dst in by_id
    )
    return (
        module_class(key, group),
        tuple(sorted(Counter(by_id.values()).items())),
        tuple(sorted(inner.items())),
    )


def _sibling_key(level: str) -> tuple[tuple[str, str], int]:
    """``layers.3`` -> ((``layers``, ""), 3); ``block#2`` -> ((``block``, "#"), 2)."""
    m = _INDEXED.match(level)
    if m:
        return (m.group(1) or "", m.group(3) or ""), int(m.group(2))
    r = _REPEAT.match(level)
    assert r is not None  # the pattern matches every string
    return (r.group(1), "#"), int(r.group(2) or 0)


def _runs(children: list[tuple[str, int]], alike: Callable[[int, int], bool]) -> list[list[int]]:
    """Maximal runs (2 or more) of siblings ``(level, id)`` with consecutive indices where each
    member is ``alike`` the one before it (asked of such neighbours only: a signature is
    costly)."""
    by_stem: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for level, child in children:
        stem, idx = _sibling_key(level)
        by_stem.setdefault(stem, []).append((idx, child))
    runs: list[list[int]] = []
    for items in by_stem.values():
        if len(items) < 2:
            continue
        items.sort()
        run = [items[0]]
        for item in items[1:]:
            if item[0] == run[-1][0] + 1 and alike(run[-1][1], item[1]):
                run.append(item)
                continue
            if len(run) > 1:
                runs.append([c for _, c in run])
            run = [item]
        if len(run) > 1:
            runs.append([c for _, c in run])
    return runs


def _fold_label(run: list[str]) -> tuple[str, str]:
    """(box name, box path) of a run: ``encoder.layers.0-63 x64``, ``encoder.layers.0-63``."""
    first, last = run[0], run[-1]
    (stem, suffix), a = _sibling_key(levels(first)[-1])
    b = _sibling_key(levels(last)[-1])[1]
    parent = ".".join(levels(first)[:-1])
    head = f"{parent}." if parent else ""
    if suffix == "#":
        path = f"{head}{stem}#{a}-{b}"
    else:
        path = f"{head}{stem}{'.' if stem else ''}{a}-{b}{suffix}"
    return f"{path} x{len(run)}", path


@dataclass(frozen=True)
class Run:
    """A run of identical consecutive sibling modules (see ``fold``).

    Attributes:
        path: the run's path, ``encoder.layers.0-63`` (a module path: ``levels`` keeps
            ``layers.0-63`` as one level).
        name: its label, ``encoder.layers.0-63 x64``.
        members: the members' module paths, in index order.
        cls: the members' class name, or "".
    """

    path: str
    name: str
    members: tuple[str, ...]
    cls: str

    @property
    def repeat(self) -> int:
        return len(self.members)


def fold_runs(graph: GraphLike, *, inside: str = "none") -> list[Run]:
    """Every run of identical consecutive sibling modules, found from the top down.

    Args:
        graph: a graph traced with module scopes.
        inside: which members of a run are searched for runs of their own: ``none`` (a folded
            run is one box), ``first`` (the member a folded picture draws) or ``all`` (every
            member, as the HTML page can open any of them).

    Raises:
        ViewError: ``inside`` is none of those.

    Example:
        >>> from gradscope.graph.graph import Edge, Graph, Node
        >>> layers = [Node(str(i), "MmBackward0", "op", module=str(i)) for i in range(3)]
        >>> g = Graph(layers, [Edge("2", "1"), Edge("1", "0")], roots=["2"])
        >>> [(r.name, r.members) for r in fold_runs(g)]
        [('0-2 x3', ('0', '1', '2'))]
    """
    if inside not in ("none", "first", "all"):
        raise ViewError(f"inside must be 'none', 'first' or 'all', got {inside!r}")
    return _Folder(graph).runs(inside)


class _Folder:
    """The module tree of a graph as a ``ModuleTrie`` (every prefix an integer, so any depth
    costs the paths' length), with what ``fold_runs`` asks of it."""

    def __init__(self, graph: GraphLike) -> None:
        self.graph = graph
        self.paths = node_paths(graph)
        self.trie = trie = ModuleTrie()
        self.direct: dict[int, list[int]] = {}  # trie index -> indices of its own nodes
        self.mod: dict[str, int] = {}  # node id -> trie index of its path
        for i, n in enumerate(graph.nodes):
            path = self.paths[n.id]
            if path is None:
                continue
            m = trie.add(path)
            self.mod[n.id] = m
            self.direct.setdefault(m, []).append(i)
        self._keys: dict[int, str] = {0: ""}
        self._by_lca: dict[int, list[Edge]] | None = None
        self._sigs: dict[int, object] = {}
        self._index: dict[str, int] | None = None

    def key(self, m: int) -> str:
        k = self._keys.get(m)
        if k is None:
            k = self._keys[m] = self.trie.path(m)
        return k

    def subtree(self, m: int) -> list[Node]:
        """Every node inside module ``m``, in graph order."""
        found: list[int] = []
        todo = [m]
        while todo:
            k = todo.pop()
            found.extend(self.direct.get(k, ()))
            todo.extend(self.trie.children[k])
        found.sort()
        return [self.graph.nodes[i] for i in found]

    def _lca(self, a: int, b: int) -> int:
        depth, parent = self.trie.depth, self.trie.parent
        while depth[a] > depth[b]:
            a = parent[a]
        while depth[b] > depth[a]:
            b = parent[b]
        while a != b:
            a, b = parent[a], parent[b]
        return a

    def inner(self, m: int) -> list[Edge]:
        """The edges with both ends inside module ``m``: each edge is filed once under the
        deepest module holding both ends, so the lookups of all modules cost the sum of their
        subtrees, not one pass over every edge per module (which made folding a
        28,000-module Sequential quadratic)."""
        if self._by_lca is None:
            self._by_lca = {}
            for e in self.graph.edges:
                a, b = self.mod.get(e.src), self.mod.get(e.dst)
                if a is not None and b is not None:
                    self._by_lca.setdefault(self._lca(a, b), []).append(e)
        out: list[Edge] = []
        todo = [m]
        while todo:
            k = todo.pop()
            out.extend(self._by_lca.get(k, ()))
            todo.extend(self.trie.children[k])
        return out

    def signature(self, m: int) -> object:
        sig = self._sigs.get(m)
        if sig is None:
            sig = self._sigs[m] = _signature(self.key(m), self.subtree(m), self.inner(m))
        return sig

    def runs(self, inside: str) -> list[Run]:
        trie = self.trie
        runs: list[Run] = []
        todo = [0]
        while todo:
            parent = todo.pop()
            # siblings share their parent's path: ordered by their own level, as by their path
            kids = sorted(trie.children[parent], key=lambda k: trie.level[k])
            succ: list[dict[int, set[int]]] = []  # the parent's item graph, built when asked

            def alike(a: int, b: int, parent: int = parent,
                      succ: list[dict[int, set[int]]] = succ) -> bool:
                if self.signature(a) != self.signature(b):
                    return False
                if not succ:
                    succ.append(self.items(parent))
                return _consecutive(succ[0], a, b)

            folded: set[int] = set()
            for run in _runs([(trie.level[k], k) for k in kids], alike):
                keys = [self.key(k) for k in run]
                name, path = _fold_label(keys)
                members = [n for k in run for n in self.subtree(k)]
                runs.append(Run(path, name, tuple(keys), module_class(keys[0], members)))
                folded.update(run)
                if inside == "first":
                    todo.append(run[0])
                elif inside == "all":
                    todo.extend(run)
            todo.extend(k for k in kids if k not in folded)
        return runs

    def items(self, parent: int) -> dict[int, set[int]]:
        """The forward graph between the direct items of module ``parent``: its child modules
        (trie indices) and its own nodes (``-1 - node index``); an edge goes from an input's
        item to its user's."""
        trie = self.trie
        if self._index is None:
            self._index = {n.id: i for i, n in enumerate(self.graph.nodes)}
        index = self._index
        depth = trie.depth[parent]
        item: dict[str, int | None] = {}

        def item_of(nid: str) -> int | None:
            m = self.mod.get(nid)
            if m is None:  # no module: the model's own (an input, an output)
                return -1 - index[nid] if parent == 0 and nid in index else None
            if trie.depth[m] <= depth:
                return -1 - index[nid] if m == parent else None
            while trie.depth[m] > depth + 1:
                m = trie.parent[m]
            return m if trie.parent[m] == parent else None

        succ: dict[int, set[int]] = {}
        for e in self.graph.edges if parent == 0 else self.inner(parent):
            for nid in (e.src, e.dst):
                if nid not in item:
                    item[nid] = item_of(nid)
            x, y = item[e.dst], item[e.src]
            if x is not None and y is not None and x != y:
                succ.setdefault(x, set()).add(y)
        return succ


def _consecutive(succ: dict[int, set[int]], a: int, b: int) -> bool:
    """Whether the calls of sibling modules ``a`` and ``b`` (``b`` called later) follow one
    another: no other module of their parent lies on a forward path from ``a`` to ``b``
    (``succ``: ``_Folder.items``). A ResNet block's ``relu`` before and after
    ``conv2``/``bn2``, or T5's ``dropout`` on the embeddings and after the last layer, are two
    calls of one module that do not."""
    seen: set[tuple[int, bool]] = set()
    todo = [(x, x >= 0 and x != b) for x in succ.get(a, ())]
    while todo:
        x, through = todo.pop()
        if x == b:
            if through:
                return False
            continue
        if x == a or (x, through) in seen:
            continue
        seen.add((x, through))
        for nxt in succ.get(x, ()):
            todo.append((nxt, through or (nxt >= 0 and nxt != b)))
    return True


def fold(graph: G, *, keep_first: bool = False) -> G:
    """A new graph where each run of identical consecutive sibling modules is one box.

    Siblings are ``layers.0``, ``layers.1``, ... (or repeated calls ``block``, ``block#1``, ...)
    of one class whose subgraphs have the same nodes, relative module paths, saved shapes and
    internal edges. A run of 64 becomes one ``module`` node named ``layers.0-63 x64`` with
    ``box.repeat == 64``. Runs are found from the top down: a folded run's insides are
    not folded again.

    Args:
        graph: a graph traced with module scopes.
        keep_first: keep the run's first member as it is (its nodes, and runs inside it folded
            in turn), so a picture shows what one layer holds: the box then stands for the other
            members only and ``box.shown`` names the member kept (``encoder.layers.0``).

    Example:
        >>> from gradscope.graph.graph import Edge, Graph, Node
        >>> layers = [Node(str(i), "MmBackward0", "op", module=str(i)) for i in range(8)]
        >>> chain = [Edge("out", "7")] + [Edge(str(i + 1), str(i)) for i in range(7)]
        >>> g = Graph([Node("out", "output", "output"), *layers], chain, roots=["out"])
        >>> [n.name for n in fold(g).nodes]
        ['output', '0-7 x8']
    """
    folder = _Folder(graph)
    runs = {r.path: r for r in folder.runs("first" if keep_first else "none")}
    trie = folder.trie
    member_of: dict[int, str] = {}  # module trie index -> the run path its nodes fold into
    for run in runs.values():
        for k in run.members[1:] if keep_first else run.members:
            m = trie.find(k)
            if m is not None:
                member_of[m] = run.path
    key_of: dict[str, str] = {}
    if member_of:
        for n in graph.nodes:
            m = folder.mod.get(n.id)
            found = None
            while m is not None and m > 0:  # the outermost run the node lies in
                found = member_of.get(m, found)
                m = trie.parent[m]
            if found is not None:
                key_of[n.id] = found

    kinds = alias_kinds(graph)

    def make(nid: str, key: str, group: list[Node]) -> Node:
        run = runs[key]
        node = _box(nid, run.name, key, group, run.repeat, kinds)
        assert node.box is not None
        if not node.box.cls:
            node.box.cls = run.cls
        if keep_first:
            node.box.shown = run.members[0]
        return node

    return _regroup(graph, key_of, make)
