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
from .nodes import Box, Edge, GraphLike, Node, SavedTensor, storage_sizes
from .paths import inside, levels, module_class, node_paths


class _GraphClass(GraphLike, Protocol):
    """A graph that its class builds from the three lists (``Graph(nodes, edges, roots)``)."""

    def __init__(self, nodes: list[Node], edges: list[Edge], roots: list[str]) -> None: ...


#: A graph type: the views return graphs of the class they were given (``Graph``).
G = TypeVar("G", bound=_GraphClass)

_INDEXED = re.compile(r"^(?:(.*)\.)?(\d+)(#\d+)?$")
_REPEAT = re.compile(r"^(.*?)(?:#(\d+))?$")
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
    paths = node_paths(graph)
    deepest = max((len(levels(p)) for p in paths.values() if p is not None), default=0)
    for depth in range(deepest, -1, -1):
        if collapsed_size(graph, depth, paths) <= max_nodes:
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


def _inner_edges(
    graph: GraphLike, paths: dict[str, str | None], children: dict[str, set[str]]
) -> Callable[[str], list[Edge]]:
    """``inner(key)``: the edges with both ends inside module ``key``. Each edge is filed once
    under the deepest module holding both ends, so the lookups of all modules cost the sum of
    their subtrees, not one pass over every edge per module (which made folding a
    28,000-module Sequential quadratic)."""
    key_levels = {nid: levels(p) for nid, p in paths.items() if p is not None}
    by_lca: dict[str, list[Edge]] = {}
    for e in graph.edges:
        a, b = key_levels.get(e.src), key_levels.get(e.dst)
        if not a or not b:
            continue
        d = 0
        while d < len(a) and d < len(b) and a[d] == b[d]:
            d += 1
        if d:
            by_lca.setdefault(".".join(a[:d]), []).append(e)

    def inner(key: str) -> list[Edge]:
        out: list[Edge] = []
        todo = [key]
        while todo:
            k = todo.pop()
            out.extend(by_lca.get(k, ()))
            todo.extend(children.get(k, ()))
        return out

    return inner


def _sibling_key(level: str) -> tuple[tuple[str, str], int]:
    """``layers.3`` -> ((``layers``, ""), 3); ``block#2`` -> ((``block``, "#"), 2)."""
    m = _INDEXED.match(level)
    if m:
        return (m.group(1) or "", m.group(3) or ""), int(m.group(2))
    r = _REPEAT.match(level)
    assert r is not None  # the pattern matches every string
    return (r.group(1), "#"), int(r.group(2) or 0)


def _runs(children: list[str], sigs: dict[str, object]) -> list[list[str]]:
    """Maximal runs (2 or more) of siblings with consecutive indices and equal signatures."""
    by_stem: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for child in children:
        stem, idx = _sibling_key(levels(child)[-1])
        by_stem.setdefault(stem, []).append((idx, child))
    runs: list[list[str]] = []
    for items in by_stem.values():
        items.sort()
        run = [items[0]]
        for item in items[1:]:
            if item[0] == run[-1][0] + 1 and sigs[item[1]] == sigs[run[-1][1]]:
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
    paths = node_paths(graph)
    groups: dict[str, list[Node]] = {}  # module key -> every node in its subtree
    children: dict[str, set[str]] = {}
    for n in graph.nodes:
        path = paths[n.id]
        if path is None:
            continue
        lv = levels(path)
        for d in range(1, len(lv) + 1):
            key = ".".join(lv[:d])
            groups.setdefault(key, []).append(n)
            children.setdefault(".".join(lv[: d - 1]), set()).add(key)
    inner = _inner_edges(graph, paths, children)
    runs: list[Run] = []
    todo = [""]
    while todo:
        parent = todo.pop()
        kids = sorted(children.get(parent, ()))
        sigs = {k: _signature(k, groups[k], inner(k)) for k in kids}
        folded: set[str] = set()
        for run in _runs(kids, sigs):
            name, path = _fold_label(run)
            members = [n for k in run for n in groups[k]]
            runs.append(Run(path, name, tuple(run), module_class(run[0], members)))
            folded.update(run)
            if inside == "first":
                todo.append(run[0])
            elif inside == "all":
                todo.extend(run)
        todo.extend(k for k in kids if k not in folded)
    return runs


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
    paths = node_paths(graph)
    runs = {r.path: r for r in fold_runs(graph, inside="first" if keep_first else "none")}
    member_of: dict[str, str] = {}  # module key -> the run path its nodes fold into
    for run in runs.values():
        for k in run.members[1:] if keep_first else run.members:
            member_of[k] = run.path
    key_of: dict[str, str] = {}
    for n in graph.nodes:
        path = paths[n.id]
        if path is None:
            continue
        lv = levels(path)
        for d in range(1, len(lv) + 1):
            run_path = member_of.get(".".join(lv[:d]))
            if run_path is not None:
                key_of[n.id] = run_path
                break

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
        "more", f"… {len(rest)} more nodes", "module", saved=[s for n in rest for s in n.saved],
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
