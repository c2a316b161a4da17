"""Module clusters in DOT: each module a nested ``subgraph cluster_*`` labelled
``name: Class``, a fold that keeps its first member a cluster around that member and the box
of the others, and a parameter's ``leaf -> AccumulateGrad`` chain on the rank of the op that
uses it (see ``gradscope.render.dot``).

Clusters are kept as a trie of interned prefixes and written iteratively, so a module path
thousands of levels deep costs its length, never its length squared nor the recursion limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.graph import Graph, Node
from ..graph.paths import levels, node_paths
from ..output.style import CLUSTER_ATTR
from .dot_nodes import _node_lines, _Options
from .dot_tokens import quote

#: Deeper clusters are written with this many tabs: indentation stays linear in the input.
MAX_INDENT = 32
#: A cluster's tooltip names its module path; a longer one keeps its end (a path thousands of
#: levels deep would otherwise make the DOT text grow with the square of its depth).
MAX_TOOLTIP = 200


@dataclass
class _Cluster:
    """One drawn cluster: its parent's index, its level (``layers.3``), the module it shows
    (a module trie index; -1 for a fold), the fold box it stands for, if any, and its depth in
    real module levels."""

    parent: int
    level: str
    module: int
    fold: Node | None
    depth: int


@dataclass
class _Clusters:
    """Where each node is drawn: ``of`` (node id -> cluster index; 0 is the top level), the
    clusters as a trie of interned prefixes (so a path thousands of levels deep costs its
    length, not its length squared), and the modules they show (trie indices)."""

    of: dict[str, int]
    clusters: list[_Cluster]
    box_module: dict[str, int]  # a module box's node id -> its module's trie index

    module_tail: list[str]  # module trie index -> its path's last MAX_TOOLTIP characters
    module_size: list[int]  # ... and its full length

    def module_path(self, m: int) -> str:
        """The dotted path of module ``m``; a longer one than ``MAX_TOOLTIP`` keeps its end."""
        tail = self.module_tail[m]
        return tail if self.module_size[m] <= MAX_TOOLTIP else "…" + tail[1:]


def _cluster_keys(graph: Graph) -> _Clusters:
    """The cluster each node is drawn in. A fold box with ``shown`` (``fold(keep_first=True)``)
    gets a cluster of its own around itself and the member it keeps: ``layers.0-63 x64`` holds
    ``layers.0`` and the ``layers.1-63`` box."""
    module_tail, module_size = [""], [0]
    mtrie: dict[tuple[int, str], int] = {}
    clusters = [_Cluster(-1, "", 0, None, 0)]
    ctrie: dict[tuple[int, str], int] = {}

    def module(parent: int, level: str) -> int:
        m = mtrie.get((parent, level))
        if m is None:
            m = mtrie[(parent, level)] = len(module_tail)
            up = module_tail[parent]
            module_tail.append((f"{up}.{level}" if parent else level)[-MAX_TOOLTIP:])
            module_size.append(module_size[parent] + (1 if parent else 0) + len(level))
        return m

    def cluster(parent: int, level: str, m: int, depth: int) -> int:
        c = ctrie.get((parent, level))
        if c is None:
            c = ctrie[(parent, level)] = len(clusters)
            clusters.append(_Cluster(parent, level, m, None, depth))
        return c

    def mwalk(lv: list[str]) -> int:
        m = 0
        for part in lv:
            m = module(m, part)
        return m

    def walk(lv: list[str]) -> int:
        """The cluster of levels ``lv``, with the level of each fold whose kept member they
        lie in inserted."""
        c = m = 0
        for depth, part in enumerate(lv, 1):
            m = module(m, part)
            box = folds.get(m)
            if box is not None:
                c = cluster(c, levels(box.module or "")[-1], -1, depth - 1)
                clusters[c].fold, clusters[c].module = box, -1
            c = cluster(c, part, m, depth)
        return c

    folds: dict[int, Node] = {}  # module trie index of the member a fold keeps -> the fold box
    for n in graph.nodes:
        if n.kind == "module" and n.box is not None and n.box.shown and n.module:
            folds[mwalk(levels(n.box.shown))] = n
    of: dict[str, int] = {}
    box_module: dict[str, int] = {}
    for nid, path in node_paths(graph).items():
        lv = levels(path) if path else []
        node = graph.node(nid)
        if node.kind == "module" and node.module is not None:
            box_module[nid] = mwalk(levels(node.module))
            # the box of a fold's others sits in its fold's cluster (its path's last level);
            # any other box stands for its module: drawn inside the module's parent
            if not (node.box is not None and node.box.shown) and lv:
                lv = lv[:-1]
        of[nid] = walk(lv)
    return _Clusters(of, clusters, box_module, module_tail, module_size)


def param_chains(graph: Graph, of: dict[str, int]) -> dict[str, list[str]]:
    """AccumulateGrad id -> ``[leaf, AccumulateGrad, consumer]``: a parameter drawn on the rank
    of the op that uses it (both in one cluster, ``{rank=same; ...}``): a module's parameters
    then add no rank above it, and consecutive modules stack instead of spreading sideways.
    ``of``: each node's cluster (``_cluster_keys(graph).of``)."""
    kinds = {n.id: n.kind for n in graph.nodes}
    leaf: dict[str, str] = {}
    users: dict[str, list[str]] = {}
    for e in graph.edges:
        if kinds.get(e.src) == "accumulate" and kinds.get(e.dst) == "leaf":
            leaf[e.src] = e.dst
        elif kinds.get(e.dst) == "accumulate" and e.kind == "grad":
            users.setdefault(e.dst, []).append(e.src)
    out = {}
    for acc, lf in leaf.items():
        chain = [lf, acc]
        use = users.get(acc, [])
        if len(use) == 1 and of.get(use[0]) == of.get(acc):
            chain.append(use[0])
        out[acc] = chain
    return out


def flat_edges(chains: dict[str, list[str]]) -> set[tuple[str, str]]:
    """The (src, dst) pairs with both ends in one chain: an edge on one rank. Its label goes in
    ``xlabel``: Graphviz's ranker, which makes a label a node of its own on a flat edge, gives
    up (``trouble in init_rank``) or runs for minutes on many such groups in nested clusters
    (DenseNet-121 ``--backward``: over 100 s unfinished; 18 s of CPU with ``xlabel``)."""
    return {(a, b) for chain in chains.values() for a in chain for b in chain if a != b}


def _cluster_lines(graph: Graph, cl: _Clusters, opt: _Options,
                   chains: dict[str, list[str]]) -> list[str]:
    """Nodes nested in ``subgraph cluster_*`` blocks by module path, in first-seen order."""
    of = cl.of
    kids: dict[int, list[int]] = {}  # cluster -> child clusters, in first-seen order
    listed: set[int] = {0}
    members: dict[int, list[Node]] = {}
    knows: dict[int, Node] = {}  # cluster -> a node inside it that knows its class
    parent_of = [c.parent for c in cl.clusters]
    for node in graph.nodes:
        c = of[node.id]
        members.setdefault(c, []).append(node)
        if node.kind == "module" or node.module_classes:
            k = c
            while k > 0 and k not in knows:
                knows[k] = node
                k = parent_of[k]
        k = c
        while k not in listed:
            listed.add(k)
            kids.setdefault(parent_of[k], []).append(k)
            k = parent_of[k]
    out: list[str] = []
    counter = 0
    # (cluster, depth, opening?): iterative, so deep module trees meet no recursion limit
    stack: list[tuple[int, int, bool]] = [(0, 0, True)]
    while stack:
        c, depth, opening = stack.pop()
        indent = "\t" * min(depth, MAX_INDENT)
        if not opening:
            out.append(f"{indent}}}")
            continue
        if depth:
            out.append(f"{indent}subgraph cluster_{counter} {{")
            label, tip = _cluster_label(c, cl, knows)
            head = f"label={quote(label)} tooltip={quote(tip)}"
            out.append(f"{indent}\tgraph [{head} {CLUSTER_ATTR}]")
            counter += 1
            stack.append((c, depth, False))
        for node in members.get(c, ()):
            out.extend(_node_lines(node, opt, indent + "\t"))
            if node.id in chains:
                ranked = "; ".join(opt.ids.of(x) for x in chains[node.id])
                out.append(f"{indent}\t{{rank=same; {ranked}}}")
        stack.extend((child, depth + 1, True) for child in reversed(kids.get(c, [])))
    return out


def _cluster_label(c: int, cl: _Clusters, knows: dict[int, Node]) -> tuple[str, str]:
    """(label, tooltip) of a cluster: ``name: Class``; a fold's says what it folds."""
    cluster = cl.clusters[c]
    box = cluster.fold
    if box is not None:
        assert box.box is not None and box.box.shown is not None
        cls = box.box.cls
        first = levels(box.box.shown)[-1]
        name = f"{cluster.level} x{box.box.repeat}"
        label = f"{name}: {cls}".rstrip(": ") + f" ({first} drawn, the others alike)"
        return label, f"{_tail(box.module or '')}: draw every repeat with --no-fold"
    cls = ""
    sample = knows.get(c)
    if sample is not None and sample.module is not None:  # as paths.module_class, but O(1)
        depth = cluster.depth
        if (sample.box is not None and sample.box.cls
                and cl.box_module.get(sample.id) == cluster.module):
            cls = sample.box.cls
        else:
            chain = sample.module_classes
            if chain and len(chain) > depth and chain[depth]:
                cls = chain[depth]
    return f"{cluster.level}: {cls}".rstrip(": "), cl.module_path(cluster.module)


def _tail(path: str, limit: int = MAX_TOOLTIP) -> str:
    return path if len(path) <= limit else "…" + path[-limit:]
