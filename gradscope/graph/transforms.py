"""Big-graph views: collapse modules below a depth, fold runs of identical layers, keep the
nodes nearest the outputs, and ``readable_view``, which picks among them for a picture.

Each takes a ``Graph`` whose nodes carry module paths (``gs.scopes``) and returns a new, smaller
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

Collapsing, ``nearest`` and ``readable_view`` are here; folding (``fold``, ``fold_runs``,
``Run``) is in ``folding`` and the regrouping they share in ``regroup``; every one of them is
importable from here.
"""

from __future__ import annotations

from ..errors import ViewError
from ..memory.saved_records import alias_kinds, split_bytes
from .folding import Run, fold, fold_runs
from .nodes import (
    Box,
    GraphLike,
    Node,
    plural,
    storage_sizes,
)
from .paths import ModuleTrie, levels, node_paths
from .regroup import G, _box, _regroup

#: The big-graph views (folding's names included), as ``from gradscope.graph.transforms import``
#: has always given them.
__all__ = [
    "Run",
    "auto_depth",
    "collapse",
    "collapsed_size",
    "fold",
    "fold_runs",
    "nearest",
    "readable_view",
]


def collapse(graph: G, depth: int) -> G:
    """A new graph where each module at ``depth`` is one node standing for all nodes inside it.

    Nodes of shallower modules, and nodes with no module (outputs, inputs), stay as they are.

    Args:
        graph: a graph traced with module scopes (``gs.scopes``, or the CLI).
        depth: module levels to keep; 0 makes the whole model one box (see module docstring).

    Raises:
        ViewError: ``depth`` is negative.

    Example:
        >>> from gradscope.graph.graph import Edge, Graph, Node
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
        >>> from gradscope.graph.graph import Graph
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


def nearest(graph: G, max_nodes: int) -> tuple[G, int]:
    """The ``max_nodes`` nodes nearest the outputs (breadth first from the roots, along the
    gradient's direction), and one box standing for everything beyond them; with the number of
    nodes that box hides (0 when the graph already fits).

    A graph with no module structure cannot be collapsed; this is what keeps its picture to a
    size Graphviz lays out in seconds.

    Example:
        >>> from gradscope.graph.graph import Edge, Graph, Node
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
        >>> from gradscope.graph.graph import Graph
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
