"""Big-graph views: collapse modules below a depth, fold runs of identical layers.

Both take a ``Graph`` whose nodes carry module paths (``gs.scopes``) and return a new, smaller
``Graph`` in which a group of nodes is one node of kind ``module``: ``name`` is its label,
``module`` its path, ``box`` a ``Box`` with the module's class name, how many original nodes
it stands for and the bytes of its saved tensors (each storage counted once; the part that
aliases parameters/inputs and outputs apart from activations), and ``saved`` keeps the
members' saved-tensor records, so ``Graph.saved_bytes()`` and the total node count are the same
before and after. Edges between groups are merged into one
``Edge`` whose ``count`` says how many it stands for.

Depth counts module levels below the model: ``encoder`` is at depth 1 and ``encoder.layers.3``
at depth 2, because an item of a ``ModuleList``/``Sequential`` (a numeric component) counts with
its container's name. A ``leaf`` node belongs to the module of its ``AccumulateGrad``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..errors import ViewError
from .memory import alias_kinds, split_bytes
from .nodes import Box, Edge, GraphLike, Node, SavedTensor, plural, storage_sizes
from .paths import ModuleTrie, inside, levels, module_class, node_paths


class _GraphClass(GraphLike, Protocol):
    """A graph that its class builds from the three lists (``Graph(nodes, edges, roots)``)."""

    def __init__(self, nodes: list[Node], edges: list[Edge], roots: list[str]) -> None: ...


#: A graph type: the views return graphs of the class they were given (``Graph``).
G = TypeVar("G", bound=_GraphClass)

_INDEXED = re.compile(r"(?:(.*)\.)?(\d+)(#\d+)?\Z", re.S)
_REPEAT = re.compile(r"(.*?)(?:#(\d+))?\Z", re.S)
_KIND_INDEX = {"leaf": 1, "output": 2}


def _box(
    nid: str,
    name: str,
    path: str,
    members: list[Node],
    repeat: int | None = None,
    kinds: dict[str, str] | None = None,
) -> Node:
    """A module node standing for ``members``; ``kinds`` (``alias_kinds`` of the whole graph)
    splits its saved bytes into activations and aliases of leaves and outputs."""
    saved = [
        SavedTensor(f"{m.name}.{s.name}" if m.kind != "module" else s.name, s.shape, s.dtype,
                    s.device, s.nbytes, s.storage, s.freed, s.storage_nbytes)
        for m in members
        for s in m.saved
    ]
    kinds = kinds or {}
    sizes = storage_sizes([Node("", "", "op", saved=saved)])
    split = [0, 0, 0]
    for sid, size in sizes.items():
        split[_KIND_INDEX.get(kinds.get(sid, ""), 0)] += size
    box = Box(
        module_class(path, members),
        sum(m.count for m in members),
        sum(sizes.values()),
        repeat,
        leaf_bytes=split[1],
        output_bytes=split[2],
        aliases={sid: kinds[sid] for sid in sizes if sid in kinds},
    )
    return Node(
        nid, name, "module", module=path, saved=saved, module_classes=_chain_prefix(path, members),
        box=box,
    )


def _chain_prefix(path: str, members: list[Node]) -> tuple[str, ...] | None:
    """The ``module_classes`` chain of ``path`` itself, cut from a member's longer chain."""
    want = len(levels(path))
    for n in members:
        chain = n.module_classes
        if chain and inside(n.module, path) and len(chain) > want:
            return chain[: want + 1]
    return None


def _regroup(
    graph: G, key_of: dict[str, str], make: Callable[[str, str, list[Node]], Node]
) -> G:
    """Replace each set of nodes sharing a key by ``make(id, key, members)``; merge edges."""
    members: dict[str, list[Node]] = {}
    for n in graph.nodes:
        key = key_of.get(n.id)
        if key is not None:
            members.setdefault(key, []).append(n)
    new_id: dict[str, str] = {}
    nodes: list[Node] = []
    boxes: dict[str, str] = {}
    for n in graph.nodes:
        key = key_of.get(n.id)
        if key is None:
            nodes.append(n)
            new_id[n.id] = n.id
            continue
        if key not in boxes:
            group = members[key]
            only = group[0]
            box = only if len(group) == 1 and only.kind == "module" and only.module == key else None
            box = box or make(f"m{len(boxes)}", key, group)
            boxes[key] = box.id
            nodes.append(box)
        new_id[n.id] = boxes[key]
    edges = _merge_edges(graph.edges, new_id)
    # the input's own class (a Graph): this module never imports Graph, which imports it
    return type(graph)(nodes=nodes, edges=edges, roots=_dedup(new_id[r] for r in graph.roots))


def _merge_edges(edges: list[Edge], new_id: dict[str, str]) -> list[Edge]:
    merged: dict[tuple[str, str, str], Edge] = {}
    for e in edges:
        src, dst = new_id[e.src], new_id[e.dst]
        if src == dst:
            continue  # inside one group
        if src == e.src and dst == e.dst:
            merged.setdefault((src, dst, f"{e.kind}:{e.input_nr}"), e)
            continue
        key = (src, dst, e.kind)
        old = merged.get(key)
        if old is None:
            merged[key] = Edge(src, dst, e.input_nr, e.kind, e.grad_norm, e.count)
        else:  # one norm stands for one edge only: a merged edge has none
            merged[key] = Edge(src, dst, old.input_nr, e.kind, None, old.count + e.count)
    return list(merged.values())


def _dedup(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def collapse(graph: G, depth: int) -> G:
    """A new graph where each module at ``depth`` is one node standing for all nodes inside it.

    Nodes of shallower modules, and nodes with no module (outputs, inputs), stay as they are.

    Args:
        graph: a graph traced with module scopes (``gs.scopes``, or the CLI).
        depth: module levels to keep; 0 makes the whole model one box (see module docstring).

    Raises:
        ViewError: ``depth`` is negative.

    Example:
        >>> from gradscope.model.graph import Edge, Graph, Node
        >>> g = Graph(  # Sequential(Linear, ReLU): each op in its module
        ...     [Node("n0", "output", "output"), Node("n1", "ReluBackward0", "op", module="1"),
        ...      Node("n2", "AddmmBackward0", "op", module="0")],
        ...     [Edge("n0", "n1"), Edge("n1", "n2")], roots=["n0"])
        >>> [n.name for n in collapse(g, 1).nodes]
        ['output', '1', '0']
    """
    if depth < 0:
        raise ViewError(
            f"depth must be 0 or more, got {depth} (0 shows the whole model as one box)"
        )
    key_of: dict[str, str] = {}
    for nid, path in node_paths(graph).items():
        if path is None:
            continue
        lv = levels(path)
        if len(lv) >= depth:
            key_of[nid] = ".".join(lv[:depth])

    kinds = alias_kinds(graph)

    def make(nid: str, key: str, group: list[Node]) -> Node:
        return _box(nid, key or "(model)", key, group, kinds=kinds)

    return _regroup(graph, key_of, make)


def collapsed_size(graph: GraphLike, depth: int, paths: dict[str, str | None] | None = None) -> int:
    """Number of nodes ``collapse(graph, depth)`` would have, without building it."""
    paths = node_paths(graph) if paths is None else paths
    keys: set[str] = set()
    kept = 0
    for path in paths.values():
        lv = levels(path) if path is not None else None
        if lv is None or len(lv) < depth:
            kept += 1
        else:
            keys.add(".".join(lv[:depth]))
    return kept + len(keys)


def auto_depth(graph: GraphLike, max_nodes: int = 1500) -> int | None:
    """The deepest depth whose collapsed graph has at most ``max_nodes`` nodes.

    Returns:
        None when the graph already fits (draw it whole); else that depth, or 0 when even
        one box per model does not fit.

    Example:
        >>> from gradscope.model.graph import Graph
        >>> auto_depth(Graph(), max_nodes=10) is None
        True
    """
    if len(graph.nodes) <= max_nodes:
        return None
    # collapse(d) keeps every node shallower than d and makes one box per distinct prefix of
    # depth d: both counted per depth in one pass over the module trie, not per depth tried.
    trie = ModuleTrie()
    shallow: list[int] = [0]  # shallow[d]: nodes whose path has exactly d levels (None: 0)
    for path in node_paths(graph).values():
        d = trie.depth[trie.add(path)] if path is not None else 0
        if path is None:
            shallow[0] += 1  # never collapsed: count it at every depth below
            continue
        while len(shallow) <= d + 1:
            shallow.append(0)
        shallow[d + 1] += 1  # kept by collapse(depth) for every depth > d
    deepest = max(trie.depth)
    prefixes = [0] * (deepest + 1)
    for d in trie.depth[1:]:
        prefixes[d] += 1
    prefixes[0] = 1 if len(trie.depth) > 1 or any(
        p is not None for p in node_paths(graph).values()) else 0
    kept = 0
    sizes = []
    for depth in range(deepest + 1):
        kept += shallow[depth] if depth < len(shallow) else 0
        sizes.append(kept + prefixes[depth])
    for depth in range(deepest, -1, -1):
        if sizes[depth] <= max_nodes:
            return depth
    return 0


# ---------------------------------------------------------------------- folding
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
        >>> from gradscope.model.graph import Edge, Graph, Node
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
        >>> from gradscope.model.graph import Edge, Graph, Node
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


def nearest(graph: G, max_nodes: int) -> tuple[G, int]:
    """The ``max_nodes`` nodes nearest the outputs (breadth first from the roots, along the
    gradient's direction), and one box standing for everything beyond them; with the number of
    nodes that box hides (0 when the graph already fits).

    A graph with no module structure cannot be collapsed; this is what keeps its picture to a
    size Graphviz lays out in seconds.

    Example:
        >>> from gradscope.model.graph import Edge, Graph, Node
        >>> ops = [Node(f"n{i}", "MulBackward0", "op") for i in range(103)]  # a chain
        >>> chain = Graph(ops, [Edge(f"n{i}", f"n{i + 1}") for i in range(102)], roots=["n0"])
        >>> view, hidden = nearest(chain, 10)
        >>> len(view.nodes), hidden, view.nodes[-1].name
        (11, 93, '… 93 more nodes')
    """
    if len(graph.nodes) <= max_nodes:
        return graph, 0
    out: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    for e in graph.edges:
        out[e.src].append(e.dst)
    keep: dict[str, None] = {}
    queue = list(dict.fromkeys(graph.roots))
    queue += [n.id for n in graph.nodes if n.kind == "output" and n.id not in keep]
    head = 0
    while head < len(queue) and len(keep) < max_nodes:
        nid = queue[head]
        head += 1
        if nid in keep:
            continue
        keep[nid] = None
        queue.extend(d for d in out[nid] if d not in keep)
    rest = [n for n in graph.nodes if n.id not in keep]
    kinds = alias_kinds(graph)
    split = split_bytes(rest, kinds)
    more = Node(
        "more", f"… {plural(len(rest), 'more node')}", "module",
        saved=[s for n in rest for s in n.saved],
        box=Box("", sum(n.count for n in rest), split.total, leaf_bytes=split.leaf,
                output_bytes=split.output,
                aliases={sid: kinds[sid] for sid in storage_sizes(rest) if sid in kinds}),
    )
    key_of = {n.id: "more" for n in rest}

    def make(nid: str, key: str, group: list[Node]) -> Node:
        return more

    return _regroup(graph, key_of, make), len(rest)


def readable_view(
    graph: G,
    *,
    depth: int | None = None,
    fold_repeats: bool | None = None,
    max_nodes: int = 1500,
    full: bool = False,
) -> tuple[G, str | None]:
    """The view ``gradscope render`` draws, and a one-line note when it hid nodes on its own.

    ``full`` draws every node. Otherwise: collapse to ``depth`` when given; fold runs of
    identical layers when ``fold_repeats`` is True, or when it is None (the default) and the
    graph has more than ``max_nodes`` nodes, keeping each run's first member drawn
    (``fold(keep_first=True)``: the picture shows what a layer holds); then, with no ``depth``,
    collapse to the deepest depth that fits ``max_nodes`` (``auto_depth``); and if the view still
    has more than ``max_nodes`` nodes (a graph without module structure), keep the
    ``max_nodes`` nearest the outputs and one box for the rest (``nearest``), so Graphviz never
    gets an unbounded layout. The note says what was done and every way to see more
    (``--no-fold``, ``--depth N``, ``--full``, ``-o graph.html``).

    Example:
        >>> from gradscope.model.graph import Graph
        >>> readable_view(Graph(), max_nodes=10)
        (Graph(0 nodes, 0 edges, 0 roots, 0 B saved), None)
    """
    if full:
        return graph, None
    total = len(graph.nodes)
    view = graph if depth is None else collapse(graph, depth)
    done = []
    if fold_repeats or (fold_repeats is None and len(view.nodes) > max_nodes):
        folded = fold(view, keep_first=True)
        had = {n.name for n in view.nodes if n.kind == "module"}
        runs = [n.name for n in folded.nodes
                if n.box is not None and n.box.repeat and n.name not in had]
        if runs:
            shown = ", ".join(runs[:3]) + (", ..." if len(runs) > 3 else "")
            done.append(f"folded repeated layers ({shown}; one of each drawn)")
        view = folded
    if depth is None:
        auto = auto_depth(view, max_nodes)
        if auto is not None:
            collapsed = collapse(view, auto)
            if len(collapsed.nodes) < len(view.nodes):
                view = collapsed
                done.append(f"collapsed to depth {auto}")
    if len(view.nodes) > max_nodes:
        shown_nodes = len(view.nodes)
        view, hidden = nearest(view, max_nodes)
        done.append(f"drew the {shown_nodes - hidden} nodes nearest the outputs and one box for "
                    f"the {hidden} beyond them (no module structure left to collapse)")
    if not done:
        return view, None
    return view, (
        f"{total} nodes drawn as {len(view.nodes)}: {' and '.join(done)}; to see more use "
        "--no-fold (every repeat), --depth N (modules down to depth N), --full (every node; "
        "Graphviz may take minutes, bounded by --timeout) or -o graph.html (opens any part on "
        "demand)"
    )
